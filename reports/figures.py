"""The report's figures, PNG and PDF, with matplotlib's Agg backend and no pyplot global state.

Byte-identical for the same results: no timestamps or version strings in the files (PNG
"Software", PDF "CreationDate"/"Producer"/"Creator" are dropped), fixed size, dpi, fonts and a fixed
hash salt; everything drawn in the cells' fixed order. A figure with nothing to show yet is still
written, saying so, so the index never links to a missing file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from reports.load import Cell
from reports.tables import Report

PNG_META = {"Software": None}
PDF_META = {"Creator": None, "Producer": None, "CreationDate": None}
RC = {"font.family": "DejaVu Sans", "font.size": 8, "svg.hashsalt": "cluster-repro",
      "pdf.fonttype": 42, "axes.spines.top": False, "axes.spines.right": False}
FIGURES = ("quality_vs_data", "time_breakdown", "cluster_sizes", "worker_balance")


def _new(ncols: int = 1, width: float = 5.0, height: float = 3.2,
         left_labels: bool = False) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    # Fixed margins rather than a layout engine: constrained layout costs seconds per figure.
    fig = Figure(figsize=(width * ncols, height), dpi=100)
    axes = fig.subplots(1, ncols, squeeze=False, gridspec_kw={"wspace": 0.35})[0]
    fig.subplots_adjust(left=0.45 / ncols if left_labels else 0.1 / ncols + 0.02, right=0.98,
                        bottom=0.16, top=0.84)
    return fig, list(axes)


def _save(fig: Any, out_dir: Path, name: str) -> list[Path]:
    from repro.io import atomic_write

    paths = []
    for ext, meta in (("png", PNG_META), ("pdf", PDF_META)):
        p = out_dir / f"{name}.{ext}"
        atomic_write(p, lambda fh: fig.savefig(fh, format=ext, metadata=meta), mode="wb")
        paths.append(p)
    return paths


def _short(c: Cell) -> str:
    """A cell's name in a figure: method, allocation and weighting, workers, data set."""
    r = c.first
    alloc = {"cluster-interleave": "interleave", "uniform-shuffle": "shuffle"}.get(r.allocator,
                                                                                  r.allocator)
    return f"{c.label()} · {alloc}/{r.weight_mode} · {r.world_size}w · {r.dataset[:14]}"


def _legend(ax: Any, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in these results yet", ha="center", va="center",
            transform=ax.transAxes)
    ax.set_axis_off()


def _primary(rep: Report, cells: list[Cell]) -> tuple[str, Any]:
    """The quality a panel plots: its setting's first domain average, else its first score."""
    for d in rep.domains:
        if cells and rep.domain_keys(cells[0].first, d):
            return f"{d} average (%)", lambda c, d=d: rep.domain_cell(c, d)
    exp = rep.expected.get((cells[0].first.dataset, cells[0].first.model), set()) if cells else set()
    for key in rep.quality:
        if key[1] is not None and key[0] in exp:
            return (f"{key[0]} {key[1]}" + ("" if key[1] in ("loss", "perplexity") else " (%)"),
                    lambda c, key=key: rep.quality_cell(c, key))
    return "quality", lambda c: None


def _val(e: Any) -> float | None:
    return getattr(e, "value", None) if e not in ("", None) else None


def _err(e: Any) -> list[float]:
    if getattr(e, "lo", None) is None:
        return [0.0, 0.0]
    return [e.value - e.lo, e.hi - e.value]


def _settings(rep: Report) -> list[tuple[str, str, int | None]]:
    return sorted({(c.first.dataset, c.first.model, c.first.world_size) for c in rep.cells},
                  key=lambda s: (s[0], s[1], s[2] or 0))


def _series_name(c: Cell) -> str:
    """One line per method and settings; the ratio (or budget) varies along the line."""
    r = c.first
    extra = [f"{k}={v}" for k, v in sorted(r.params.items()) if k != "ratio"]
    if r.method == "cluster" and r.weight_mode != "rank":
        extra.append(f"weights={r.weight_mode}")
    return r.method + (f" ({', '.join(extra)})" if extra else "")


def quality_vs_data(rep: Report, out_dir: Path) -> list[Path]:
    settings = _settings(rep)
    fig, axes = _new(max(1, len(settings)))
    if not settings:
        _empty(axes[0], "runs")
    for ax, s in zip(axes, settings):
        cells = [c for c in rep.cells
                 if (c.first.dataset, c.first.model, c.first.world_size) == s]
        label, value = _primary(rep, cells)
        series: dict[str, list[tuple[float, float, list[float]]]] = {}
        for c in cells:
            x, y = _val(rep.kept_cell(c)), _val(value(c))
            if c.first.method == "base" and y is not None:
                ax.axhline(y, color="gray", linestyle=":", linewidth=1,
                           label="base model (no fine-tuning)")
                continue
            if x is None or y is None:
                continue
            if c.first.method == "full":
                ax.axhline(y, color="black", linestyle="--", linewidth=1, label="full data")
                continue
            series.setdefault(_series_name(c), []).append((x, y, _err(value(c))))
        for i, (name, pts) in enumerate(sorted(series.items())):
            pts.sort()
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            err = np.array([p[2] for p in pts]).T
            style = ":" if name == "random" else "-"
            ax.errorbar(xs, ys, yerr=err, marker="o", linestyle=style, capsize=2,
                        label=name + (" (same budget)" if name == "random" else ""))
        ax.set_xlim(0, 105)  # the whole range, so a budget reads against full data
        ax.set_xlabel("data used (% of the pool)")
        ax.set_ylabel(label)
        ax.set_title(f"{s[0]} · {s[1]} · {s[2]} workers", fontsize=8)
        _legend(ax, 7)
    return _save(fig, out_dir, "quality_vs_data")


def time_breakdown(rep: Report, out_dir: Path) -> list[Path]:
    cells = [c for c in rep.cells if c.first.method != "base"]  # nothing trained or selected
    fig, axes = _new(1, 11.0, max(2.2, 0.3 * len(cells) + 1), left_labels=True)
    ax = axes[0]
    if not cells:
        _empty(ax, "runs")
        return _save(fig, out_dir, "time_breakdown")
    labels, parts = [], {"selection": [], "training": [], "other (load, start-up, eval)": []}
    for c in cells:
        sel = _val(rep.cost_cell(c, "selection_s")) or 0.0
        train = _val(rep.cost_cell(c, "train_s")) or 0.0
        e2e = _val(rep.cost_cell(c, "end_to_end_s")) or 0.0
        labels.append(_short(c))
        parts["selection"].append(sel)
        parts["training"].append(train)
        parts["other (load, start-up, eval)"].append(max(0.0, e2e - sel - train))
    y = np.arange(len(cells))
    left = np.zeros(len(cells))
    for name, vals in parts.items():
        ax.barh(y, vals, left=left, label=name)
        left += np.asarray(vals)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (mean over seeds)")
    ax.set_title("Time breakdown: selection, training, the rest of end-to-end", fontsize=8)
    ax.legend(fontsize=7)
    return _save(fig, out_dir, "time_breakdown")


def _cluster_cells(rep: Report) -> list[tuple[Cell, list[int]]]:
    out = []
    for c in rep.cells:
        ks = sorted({int(b.split("/")[1]) for r in c.runs for (b, _) in r.diag
                     if b.startswith("cluster/") and b.split("/")[1].isdigit()})
        if ks:
            out.append((c, ks))
    return out[:4]  # the first four cells (in table order) keep the figure readable


def cluster_sizes(rep: Report, out_dir: Path) -> list[Path]:
    cc = _cluster_cells(rep)
    fig, axes = _new(max(1, len(cc)), 3.6, 3.0)
    if not cc:
        _empty(axes[0], "clustering runs")
    for ax, (c, ks) in zip(axes, cc):
        width = 0.27
        x = np.arange(len(ks))
        for j, (metric, name) in enumerate((("size_before_cap", "k-means"),
                                            ("size_after_cap", "after soft cap (before pruning)"),
                                            ("kept", "kept (after pruning)"))):
            vals = [_val(rep.diag_cell(c, f"cluster/{k}", metric)) or 0.0 for k in ks]
            ax.bar(x + (j - 1) * width, vals, width, label=name)
        ax.set_xticks(x, [str(k) for k in ks])
        ax.set_xlabel("cluster")
        ax.set_ylabel("examples")
        ax.set_title(f"{c.label()} · {c.first.allocator}, weights {c.first.weight_mode} · "
                     f"{c.first.world_size}w\n{c.first.dataset} (mean of {len(c.runs)} seed(s))",
                     fontsize=7)
        _legend(ax, 6)
    return _save(fig, out_dir, "cluster_sizes")


def worker_balance(rep: Report, out_dir: Path) -> list[Path]:
    cells = []
    for c in rep.cells:
        ks = sorted({int(b.split("/")[1]) for r in c.runs for (b, _) in r.diag
                     if b.startswith("worker/") and b.split("/")[1].isdigit()})
        if ks:
            cells.append((c, ks))
    cells = cells[:6]  # the first six cells (in table order) keep the figure readable
    fig, axes = _new(2, 5.5, 3.6)
    if not cells:
        _empty(axes[0], "per-worker logs")
        axes[1].set_axis_off()
        return _save(fig, out_dir, "worker_balance")
    width = 0.8 / len(cells)
    for i, (c, ks) in enumerate(cells):
        x = np.asarray(ks, dtype=float) + (i - (len(cells) - 1) / 2) * width
        tok = [_val(rep.diag_cell(c, f"worker/{k}", "tokens_per_step")) or 0.0 for k in ks]
        wait = [_val(rep.diag_cell(c, f"worker/{k}", "allreduce_wait_s")) or 0.0 for k in ks]
        name = _short(c)
        axes[0].bar(x, tok, width, label=name)
        axes[1].bar(x, wait, width, label=name)
    axes[0].set_ylabel("tokens per step")
    axes[1].set_ylabel("all-reduce wait, s (summed over steps)")
    n_workers = max(max(ks) for _, ks in cells) + 1
    for ax in axes:
        ax.set_xlabel("worker")
        ax.set_xticks(range(n_workers))
    fig.subplots_adjust(top=0.72)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", ncol=2, fontsize=6,
               frameon=False)
    return _save(fig, out_dir, "worker_balance")


def all_figures(rep: Report, out_dir: Path) -> list[Path]:
    """Write every figure as PNG and PDF into out_dir; returns the paths."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    with matplotlib.rc_context(RC):
        for fn in (quality_vs_data, time_breakdown, cluster_sizes, worker_balance):
            paths += fn(rep, out_dir)
    return paths
