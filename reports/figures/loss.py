"""Held-out loss, overall and per category, per method: the report's first figure where the runs
have held-out loss rows (the demo's, and any CPU-scale pool), since at that scale exact-match
scores sit near the floor and the loss is what carries signal.

One panel per setting (dataset x model x workers); rows: the pooled `heldout` loss, then every
`heldout/<category>`; one marker per cell (mean over seeds, with its 95% Student-t interval where
there are seeds). Lower is better. Byte-identical for the same results (reports/figures/main.py's
settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reports.figures.style import COLORS, LINE_IN, MARKERS, PAGE_IN, RC, _layout, _legend, _save
from reports.names import cell_method_name
from reports.values import Report

NAME = "heldout_loss"


def loss_keys(rep: Report) -> list[tuple[str, str | None]]:
    """The pooled held-out loss, then each category's, that the cells hold."""
    keys = [k for k in rep.quality if k[1] == "loss" and (k[0] == "heldout" or k[0].startswith("heldout/"))]
    return sorted(keys, key=lambda k: (k[0] != "heldout", k[0]))


def heldout_loss_figure(rep: Report, out_dir: Path) -> list[Path]:
    """Draw the figure (nothing when no cell has held-out loss rows); returns its paths."""
    import matplotlib
    from matplotlib.figure import Figure

    keys = loss_keys(rep)
    if not keys:
        return []
    matplotlib.use("Agg", force=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings: dict[tuple, list[Any]] = {}
    for c in rep.cells:
        if any(rep.run_value(r, ("heldout", "loss")) is not None for r in c.runs):
            settings.setdefault((c.first.dataset, c.first.model, c.first.world_size), []).append(c)
    panels = sorted(settings.items(), key=str)
    labels: list[str] = []
    for _, cells in panels:
        labels += [n for c in cells if (n := cell_method_name(c)) not in labels]
    style = {n: (COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]) for i, n in enumerate(labels)}
    with matplotlib.rc_context(RC):
        fig = Figure(dpi=300)
        axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
        heights = []
        for ax, ((dataset, model, ws), cells) in zip(axes, panels):
            step = 1.0 / (len(cells) + 1)  # the cells of one row, spread inside it
            for j, c in enumerate(cells):
                color, marker = style[cell_method_name(c)]
                for i, key in enumerate(keys):
                    est = rep.quality_cell(c, key)
                    v = getattr(est, "value", None)
                    if v is None:
                        continue
                    y = len(keys) - 1 - i + 0.5 - (j + 1) * step
                    lo, hi = getattr(est, "lo", None), getattr(est, "hi", None)
                    if lo is not None and hi is not None:
                        ax.plot([lo, hi], [y, y], color=color, linewidth=0.9)
                    ax.plot([v], [y], marker=marker, color=color, linestyle="none", label=cell_method_name(c))
            ax.set_yticks(range(len(keys)))
            ax.set_yticklabels(
                ["overall" if k[0] == "heldout" else k[0][len("heldout/") :] for k in reversed(keys)]
            )
            ax.set_ylim(-0.5, len(keys) - 0.5)
            ax.set_title(f"{dataset} · {model} · {ws} workers", loc="left")
            heights.append(max(0.8, 0.09 * len(cells) * len(keys)))
        axes[-1].set_xlabel("held-out loss (nats per response token; lower is better)")
        legend_rows = -(-len(labels) // 2)
        top = 0.25 + LINE_IN * legend_rows
        height = sum(heights) + 0.4 * (len(panels) - 1) + top + 0.45
        _layout(fig, PAGE_IN, height, len(panels), 1, left=1.3, right=0.15, bottom=0.45, top=top, hspace=0.4)
        _legend(fig, list(axes), ncol=2, y=1.0)
        return _save(fig, out_dir, NAME)
