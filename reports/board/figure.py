"""The board's figure: quality against total cost, one point per method and budget.

x: the total cost, selection + training in device-seconds (mean over seeds; what compute
matching equalizes); y: the primary metric's mean with its 95% interval over seeds. One colour
per method, one marker per budget; the line joins the Pareto front, the points no other point
beats in both cost and quality. Written with matplotlib's Agg backend in the report figures'
style (reports/figure_style.py), PNG and PDF, byte-identical for the same board.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from reports.board.board import Board, Entry
from reports.figures.style import COLORS, DPI, LINE_IN, MARKERS, PAGE_IN, RC, _save
from repro.core.tracks import FULL

FIGURE = "pareto"


def _points(board: Board) -> list[Entry]:
    return [e for e in board.entries if e.quality is not None and e.total_device_s is not None]


def pareto_front(points: list[tuple[float, float]], higher_is_better: bool) -> list[int]:
    """Indexes of the points no other point beats (cost no higher and quality no worse, one of
    them strictly), by cost."""
    sign = 1.0 if higher_is_better else -1.0
    front = []
    for i, (x, y) in enumerate(points):
        beaten = any(
            (x2 <= x and sign * y2 >= sign * y) and (x2 < x or sign * y2 > sign * y)
            for j, (x2, y2) in enumerate(points)
            if j != i
        )
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def pareto_figure(board: Board, out_dir: Path) -> list[Path]:
    """Write pareto.png and pareto.pdf under out_dir; returns their paths."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    pts = _points(board)
    seen_full = False
    shown = []
    for e in pts:  # full data is one point, whatever the budget
        if e.role == FULL:
            if seen_full:
                continue
            seen_full = True
        shown.append(e)
    ncol = 2
    rows = math.ceil(len(shown) / ncol) if shown else 0
    axes_h, top, below = 2.6, 0.3, 0.5 + rows * LINE_IN
    height = top + axes_h + below
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(PAGE_IN, height), dpi=DPI)
        ax = fig.add_axes([0.7 / PAGE_IN, below / height, (PAGE_IN - 0.9) / PAGE_IN, axes_h / height])
        m = board.track.metrics.primary
        if not shown:
            ax.text(0.5, 0.5, "no run with a cost and a score yet", ha="center", va="center")
            ax.set_axis_off()
            return _save(fig, out_dir, FIGURE)
        labels = list(dict.fromkeys(e.label for e in shown))
        budgets = board.track.names()
        for e in shown:
            color = COLORS[labels.index(e.label) % len(COLORS)]
            marker = "*" if e.role == FULL else MARKERS[budgets.index(e.budget) % len(MARKERS)]
            q = e.quality
            err: Any = None
            if q is not None and q.lo is not None and q.hi is not None:
                err = [[q.value - q.lo], [q.hi - q.value]]
            ax.errorbar(
                [e.total_device_s.value],  # type: ignore[union-attr]
                [q.value],  # type: ignore[union-attr]
                yerr=err,
                color=color,
                marker=marker,
                linestyle="none",
                capsize=2,
                label=e.label if e.role == FULL else f"{e.label} @ {e.budget}",
            )
        xy = [(e.total_device_s.value, e.quality.value) for e in shown]  # type: ignore[union-attr]
        front = pareto_front(xy, m.higher_is_better)
        ax.plot([xy[i][0] for i in front], [xy[i][1] for i in front], color="0.5", lw=0.8, zorder=0)
        ax.set_xlabel("total cost: selection + training (device-seconds, mean over seeds)", labelpad=1)
        unit = "" if m.metric in ("loss", "perplexity") else " (%)"
        ax.set_ylabel(f"{m.name}{unit}\n{'higher' if m.higher_is_better else 'lower'} is better")
        ax.set_title(
            f"track {board.track.track} v{board.track.version}: quality against cost (line: Pareto front)",
            loc="left",
        )
        ax.legend(
            loc="upper left",
            bbox_to_anchor=(0.0, -0.42 / axes_h),
            ncol=ncol,
            frameon=False,
            borderaxespad=0.0,
            handletextpad=0.4,
            columnspacing=1.5,
        )
        return _save(fig, out_dir, FIGURE)
