"""The claims figure: every verdict's estimate and 95% interval against its threshold.

One panel per kind of quantity (quality difference in points, held-out loss difference in nats,
training-time ratio, purity in %), one line per check and cell; the threshold is a black tick on
the line and the point's colour and marker say the verdict. Same inputs, same bytes (the report's
figure settings, reports/figures/main.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reports.claims.verdicts import Verdict
from reports.figures.style import COLORS, LINE_IN, PAGE_IN, RC, _layout, _save

STYLE = {
    "consistent": (COLORS[2], "o"),
    "not reproduced": (COLORS[1], "X"),
    "inconclusive": (COLORS[4], "s"),
}


def _panel(v: Verdict) -> str:
    if "loss" in v.metric:
        return "held-out loss: reference − cell (nats; > 0 better)"
    if "predicted from" in v.metric:
        return "training time ratio / its padded-token prediction"
    if "per padded token" in v.metric:
        return "s per padded token: cell / random at the same count"
    if "ratio" in v.metric:
        return "training time ratio (cell / full)"
    if "purity" in v.metric:
        return "purity (%)"
    return "benchmark average: cell − reference (points)"


def claims_figure(verdicts: list[Verdict], out_dir: Path, name: str = "claims") -> list[Path]:
    """Draw the figure into out_dir/<name>.{png,pdf}; rows without an estimate are left out
    (the table names them), and a figure with none says so."""
    import matplotlib
    from matplotlib.figure import Figure

    matplotlib.use("Agg", force=True)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    shown = [v for v in verdicts if v.estimate is not None and v.threshold is not None]
    panels: dict[str, list[Verdict]] = {}
    for v in shown:
        panels.setdefault(_panel(v), []).append(v)
    with matplotlib.rc_context(RC):
        fig = Figure(dpi=300)
        if not panels:
            fig.set_size_inches(PAGE_IN, 1.0)
            fig.text(0.5, 0.5, "no claim has an estimate yet (see the claims table: not run)", ha="center")
            return _save(fig, Path(out_dir), name)
        n_lines = sum(len(p) for p in panels.values())
        height = 0.6 + LINE_IN * 1.6 * n_lines + 0.45 * len(panels)
        axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
        for ax, (title, vs) in zip(axes, panels.items()):
            _draw(ax, title, vs)
        _layout(fig, PAGE_IN, height, len(panels), 1, left=2.75, right=0.15, bottom=0.3, top=0.5, hspace=0.5)
        handles = [
            ax.plot([], [], marker=m, color=c, linestyle="none", label=k)[0] for k, (c, m) in STYLE.items()
        ]
        handles.append(
            axes[0].plot(
                [], [], marker="|", color="black", linestyle="none", markersize=9, label="threshold"
            )[0]
        )
        fig.legend(handles=handles, loc="upper center", ncol=4, bbox_to_anchor=(0.5, 1.0))
        return _save(fig, Path(out_dir), name)


def _label(v: Verdict) -> str:
    parts = v.setting.split(" · ")
    where = f"{parts[0][:12]} {parts[-1].split()[0]}w" if len(parts) == 3 else v.setting
    return f"{v.check.name} · {v.cell} · {where}"


def _draw(ax: Any, title: str, vs: list[Verdict]) -> None:
    for i, v in enumerate(vs):
        y = len(vs) - 1 - i
        e = v.estimate
        assert e is not None and v.threshold is not None
        color, marker = STYLE.get(v.verdict, ("grey", "o"))
        if e.lo is not None and e.hi is not None:
            ax.plot([e.lo, e.hi], [y, y], color=color, linewidth=1.4)
        ax.plot([e.value], [y], marker=marker, color=color, linestyle="none")
        ax.plot([v.threshold], [y], marker="|", color="black", markersize=9, linestyle="none")
    ax.set_yticks(range(len(vs)))
    labels = [_label(v) for v in vs]
    ax.set_yticklabels([lab if len(lab) <= 46 else lab[:43] + "..." for lab in reversed(labels)])
    ax.set_ylim(-0.7, len(vs) - 0.3)
    ax.set_title(title, loc="left")
