"""The figures' common style and drawing helpers (reports/figures/main.py and the analysis, claims
and loss figures use them): paper sizes (3.25 in and 6.75 in wide, 8 pt text), colours and
markers, matplotlib's rc settings, the layout in inches, byte-identical saving (PNG and PDF with
no timestamps or version strings), the legend above the axes, and the small helpers every figure
shares.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from reports.names import setting_name
from reports.values import Report

COLUMN_IN, PAGE_IN = 3.25, 6.75  # single- and double-column widths of a two-column paper
DPI = 300
PNG_META = {"Software": None}
PDF_META = {"Creator": None, "Producer": None, "CreationDate": None}
FONT_PT = 8
RC = {
    "font.family": "DejaVu Sans",
    "font.size": FONT_PT,
    "axes.titlesize": FONT_PT,
    "axes.labelsize": FONT_PT,
    "xtick.labelsize": FONT_PT,
    "ytick.labelsize": FONT_PT,
    "legend.fontsize": FONT_PT,
    "legend.frameon": False,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "lines.linewidth": 1.0,
    "lines.markersize": 4.5,
    "svg.hashsalt": "cluster-repro",
    "pdf.fonttype": 42,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
# Okabe-Ito: colours that colour-blind readers and greyscale prints tell apart; with a marker each.
COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
PAPER_STYLE = {"color": "black", "markerfacecolor": "none", "markeredgewidth": 0.9}
JITTER = 1.0  # points of data used between neighbouring series at one budget
FIGURES = ("quality_vs_data", "time_breakdown", "cluster_sizes", "worker_balance", "step_tokens")
LINE_IN = 0.17  # height of one line of 8 pt text (a legend row), inches
UNIT_WORDS = {"s": "seconds", "min": "minutes", "h": "hours"}


def _figure(nrows: int, ncols: int) -> tuple[Any, list[Any]]:
    """A figure with a grid of axes; `_layout` then sets its size and margins in inches."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(PAGE_IN, 3.0), dpi=DPI)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _layout(
    fig: Any,
    width: float,
    height: float,
    nrows: int,
    ncols: int,
    left: float,
    right: float,
    bottom: float,
    top: float,
    hspace: float = 0.0,
    wspace: float = 0.0,
) -> None:
    """Size the figure to width x height inches; margins and gaps between axes in inches (fixed
    margins rather than a layout engine: constrained layout costs seconds per figure)."""
    fig.set_size_inches(width, height)
    cell_w = (width - left - right - wspace * (ncols - 1)) / ncols
    cell_h = (height - bottom - top - hspace * (nrows - 1)) / nrows
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=wspace / cell_w,
        hspace=hspace / cell_h,
    )


def _save(fig: Any, out_dir: Path, name: str) -> list[Path]:
    from repro.core.io import atomic_write

    paths = []
    for ext, meta in (("png", PNG_META), ("pdf", PDF_META)):
        p = out_dir / f"{name}.{ext}"

        def write(fh: Any, ext: str = ext, meta: dict = meta) -> None:
            fig.savefig(fh, format=ext, metadata=meta, dpi=DPI)

        atomic_write(p, write, mode="wb")
        paths.append(p)
    return paths


def _legend(fig: Any, axes: list[Any], ncol: int, y: float) -> None:
    """One legend for the whole figure (each label once), centred at height y (a fraction)."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    if seen:
        fig.legend(
            list(seen.values()),
            list(seen),
            loc="upper center",
            ncol=ncol,
            bbox_to_anchor=(0.5, y),
            handlelength=2.2,
            columnspacing=1.2,
            borderaxespad=0.0,
        )


def _legend_rows(n_labels: int, ncol: int) -> int:
    return math.ceil(n_labels / ncol) if n_labels else 0


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in these results yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _val(e: Any) -> float | None:
    return getattr(e, "value", None) if e not in ("", None) else None


def _err(e: Any) -> list[float]:
    if getattr(e, "lo", None) is None:
        return [0.0, 0.0]
    return [e.value - e.lo, e.hi - e.value]


def _settings(rep: Report) -> list[tuple[str, str, int | None]]:
    return sorted(
        {(c.first.dataset, c.first.model, c.first.world_size) for c in rep.cells},
        key=lambda s: (s[0], s[1], s[2] or 0),
    )


def _setting_title(s: tuple[str, str, int | None]) -> str:
    """Two short lines: the training set, then the model and workers."""
    name = setting_name(*s)
    head, _, tail = name.partition(" · ")
    return f"{head}\n{tail}" if tail else head
