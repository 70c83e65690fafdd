"""The report's figures, PNG and PDF, at a paper's sizes, with matplotlib's Agg backend and no
pyplot global state.

Sizes and fonts: single-column figures are 3.25 in wide, double-column ones 6.75 in, and every
text is 8 pt (titles 8-9 pt) at that size, so a figure placed at its width in a two-column paper
reads like the body text. Axes do not exaggerate: percentages are drawn on their full 0-100
scale and bars start at 0, so a gap of a tenth of a point looks like one. Points of different
series at one budget are set 1 point of data used apart on x (centred on the true value) and
drawn with distinct markers, so none hides another. Where the paper reports the same setting,
its numbers are drawn beside ours in hollow black markers labelled "paper".

Byte-identical for the same results: no timestamps or version strings in the files (PNG
"Software", PDF "CreationDate"/"Producer"/"Creator" are dropped), fixed size, dpi, fonts and a
fixed hash salt; everything drawn in the cells' fixed order. A figure with nothing to show yet is
still written, saying so, so the index never links to a missing file.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from reports.compact import in_main, time_unit
from reports.figures.style import (
    COLORS,
    COLUMN_IN,
    DPI,
    FONT_PT,
    JITTER,
    LINE_IN,
    MARKERS,
    PAGE_IN,
    PAPER_STYLE,
    RC,
    UNIT_WORDS,
    _empty,
    _err,
    _figure,
    _layout,
    _legend,
    _legend_rows,
    _save,
    _setting_title,
    _settings,
    _val,
)
from reports.load import Cell
from reports.names import cell_method_name, method_name, setting_name
from reports.reported import PaperCell, paper_cells
from reports.runs import RAW_METRICS
from reports.values import Report
from repro.core.steps import idle_share

# ----------------------------------------------------------------------------- quality vs data


def _primary(rep: Report, cells: list[Cell]) -> tuple[str, Any, bool]:
    """The quality a panel plots: its setting's first domain average, else its first score.
    -> (axis label, cell -> estimate, whether it is a percentage)."""
    for d in rep.domains:
        if cells and rep.domain_keys(cells[0].first, d):
            return f"{d} average (%)", lambda c, d=d: rep.domain_cell(c, d), True
    first = cells[0].first if cells else None
    exp = rep.expected.get((first.dataset, first.model), set()) if first else set()
    for key in rep.quality:
        if key[1] is not None and key[0] in exp:
            raw = key[1] in RAW_METRICS
            return (
                f"{key[0]} {key[1]}" + ("" if raw else " (%)"),
                lambda c, key=key: rep.quality_cell(c, key),
                not raw,
            )
    return "quality", lambda c: None, True


def _series_name(c: Cell) -> str:
    """One line per method and settings; the ratio (or budget) varies along the line."""
    r = c.first
    extra = [f"{k} = {v}" for k, v in sorted(r.params.items()) if k != "ratio"]
    extra += [f"{k} = {v}" for k, v in sorted(r.alloc_params.items())]
    if r.method == "cluster" and r.weight_mode != "rank":
        extra.append(f"weights {r.weight_mode}")
    if r.method == "cluster" and r.allocator != "cluster-interleave":
        extra.append({"uniform-shuffle": "shuffle"}.get(r.allocator, r.allocator))
    name = method_name(r.method, extra=extra)
    return name + (" (same data as CluSTER)" if r.method == "random" else "")


def _honest_ylim(ax: Any, percent: bool, values: list[float]) -> None:
    """Percentages on their whole scale; other quantities (loss) from 0 to above the largest."""
    if percent:
        ax.set_ylim(0, 100)
        ax.set_yticks(range(0, 101, 20))
    elif values:
        ax.set_ylim(0, 1.15 * max(values))


def _draw_paper(ax: Any, paper: list[PaperCell]) -> list[float]:
    """The paper's points: CluSTER's ratios joined by a thin line, full data as a star."""
    ys: list[float] = []
    by_method: dict[str, list[tuple[float, float]]] = {}
    for p in paper:
        if "data_used" in p.values and "avg_score" in p.values:
            by_method.setdefault(p.method, []).append((p.values["data_used"], p.values["avg_score"]))
    for method, pts in sorted(by_method.items()):
        pts.sort()
        ys += [y for _, y in pts]
        # Hollow and larger than ours, so our point at the same place shows inside it.
        marker = "*" if method == "full" else "o"
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            marker=marker,
            linestyle=(0, (3, 2)) if len(pts) > 1 else "none",
            linewidth=0.7,
            markersize=7 if marker == "*" else 6.5,
            zorder=4,
            label=f"{method_name(method)} (paper)",
            **PAPER_STYLE,
        )
    return ys


def quality_vs_data(rep: Report, out_dir: Path, paper: list[PaperCell]) -> list[Path]:
    """One panel per setting (single column for one, two per row at double width for more),
    with one legend below the panels."""
    settings = _settings(rep)
    n = max(1, len(settings))
    ncols = 1 if n == 1 else 2
    nrows = math.ceil(n / ncols)
    fig, axes = _figure(nrows, ncols)
    if not settings:
        _empty(axes[0], "runs")
    for ax in axes[len(settings) :]:
        if settings:
            ax.set_axis_off()
    for ax, s in zip(axes, settings):
        _quality_panel(ax, rep, s, [p for p in paper if (p.dataset, p.model, p.world_size) == s])
    labels = {lab for ax in axes for lab in ax.get_legend_handles_labels()[1]}
    panel_h, gap, top, bottom = 1.9, 0.75, 0.42, 0.4
    # The legend goes into an empty grid slot where there is one and it fits, else below.
    spare = len(axes) > len(settings) >= 1 and LINE_IN * len(labels) < panel_h
    legend_cols = 1 if ncols == 1 else 3
    legend_h = 0.0 if spare else LINE_IN * _legend_rows(len(labels), legend_cols) + 0.08
    height = top + nrows * panel_h + (nrows - 1) * gap + bottom + legend_h
    _layout(
        fig,
        COLUMN_IN if ncols == 1 else PAGE_IN,
        height,
        nrows,
        ncols,
        left=0.5,
        right=0.1,
        bottom=bottom + legend_h,
        top=top,
        hspace=gap,
        wspace=0.5,
    )
    if spare:
        seen: dict[str, Any] = {}
        for ax in axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(lab, h)
        axes[len(settings)].legend(list(seen.values()), list(seen), loc="center left", handlelength=2.2)
    else:
        _legend(fig, axes, legend_cols, legend_h / height)
    return _save(fig, out_dir, "quality_vs_data")


def _quality_panel(ax: Any, rep: Report, s: tuple, paper: list[PaperCell]) -> None:
    cells = [c for c in rep.cells if (c.first.dataset, c.first.model, c.first.world_size) == s]
    label, value, percent = _primary(rep, cells)
    series: dict[str, list[tuple[float, float, list[float]]]] = {}
    ys: list[float] = []
    missing: list[str] = []  # cells without a value to draw: said in the panel, not dropped
    for c in cells:
        x, y = _val(rep.kept_cell(c)), _val(value(c))
        if y is not None:
            ys.append(y)
        if c.first.method == "base" and y is not None:
            ax.axhline(y, color="0.45", linestyle=":", linewidth=1, label="Base model")
            continue
        if x is None or y is None:
            if c.first.method != "base":
                missing.append(cell_method_name(c))
            continue
        if c.first.method == "full":
            ax.axhline(y, color="0.2", linestyle="--", linewidth=0.9, label="Full data")
            continue
        series.setdefault(_series_name(c), []).append((x, y, _err(value(c))))
    names = sorted(series)
    for i, name in enumerate(names):
        pts = sorted(series[name])
        dx = (i - (len(names) - 1) / 2) * JITTER  # neighbours at one budget stay visible
        err = np.array([p[2] for p in pts]).T
        ax.errorbar(
            [p[0] + dx for p in pts],
            [p[1] for p in pts],
            yerr=err,
            marker=MARKERS[i % len(MARKERS)],
            color=COLORS[i % len(COLORS)],
            linestyle=":" if name.startswith("Random") else "-",
            capsize=1.5,
            elinewidth=0.7,
            alpha=0.9,
            zorder=3,
            label=name,
        )
    if percent and label.endswith("average (%)"):  # the paper reports domain averages
        ys += _draw_paper(ax, paper)
    _honest_ylim(ax, percent, ys)
    ax.set_xlim(0, 105)  # the whole range, so a budget reads against full data
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("data used (% of the pool)")
    ax.set_ylabel(label)
    ax.set_title(_setting_title(s), fontsize=FONT_PT)
    ax.grid(axis="y", linewidth=0.3, color="0.85")
    if missing:
        ax.text(
            0.02,
            0.03,
            "missing: " + "; ".join(missing),
            transform=ax.transAxes,
            ha="left",
            va="bottom",
            wrap=True,
        )


# ----------------------------------------------------------------------------- time breakdown


def time_breakdown(rep: Report, out_dir: Path) -> list[Path]:
    """Stacked bars per cell, one panel per setting, each in its own unit (s, min or h)."""
    cells = [c for c in rep.cells if c.first.method != "base"]  # nothing trained or selected
    settings = [
        s
        for s in _settings(rep)
        if any((c.first.dataset, c.first.model, c.first.world_size) == s for c in cells)
    ]
    bar_in, gap = 0.16, 0.72
    heights = [
        bar_in * sum(1 for c in cells if (c.first.dataset, c.first.model, c.first.world_size) == s)
        for s in settings
    ]
    top, bottom = 0.52, 0.4  # top: the legend's row and the first panel's title
    height = top + bottom + sum(heights) + gap * max(0, len(settings) - 1) if settings else 2.0
    # Room for the longest bar label (about 0.062 in per character of 8 pt text).
    margin = min(3.4, 0.25 + 0.062 * max((len(cell_method_name(c)) for c in cells), default=10))
    from matplotlib.figure import Figure

    fig = Figure(figsize=(PAGE_IN, height), dpi=DPI)
    if not cells:
        _empty(fig.add_subplot(), "runs")
        return _save(fig, out_dir, "time_breakdown")
    parts = ("selection", "training", "other (loading, start-up, evaluation)")
    y0 = height - top
    axes = []
    for s, h in zip(settings, heights):
        ax = fig.add_axes(
            [margin / PAGE_IN, (y0 - h) / height, (PAGE_IN - margin - 0.15) / PAGE_IN, h / height]
        )
        axes.append(ax)
        y0 -= h + gap
        sc = [c for c in cells if (c.first.dataset, c.first.model, c.first.world_size) == s]
        e2e = [_val(rep.cost_cell(c, "end_to_end_s")) or 0.0 for c in sc]
        unit, scale, _ = time_unit(e2e)
        vals = {p: [] for p in parts}
        for c, total in zip(sc, e2e):
            sel = _val(rep.cost_cell(c, "selection_s")) or 0.0
            train = _val(rep.cost_cell(c, "train_s")) or 0.0
            vals[parts[0]].append(sel / scale)
            vals[parts[1]].append(train / scale)
            vals[parts[2]].append(max(0.0, total - sel - train) / scale)
        y = np.arange(len(sc))
        left = np.zeros(len(sc))
        for i, p in enumerate(parts):
            ax.barh(y, vals[p], left=left, height=0.7, color=COLORS[i], label=p)
            left += np.asarray(vals[p])
        ax.set_yticks(y, [cell_method_name(c) for c in sc])
        ax.set_ylim(len(sc) - 0.5, -0.5)
        ax.set_xlim(0, 1.05 * max(left.max(), 1e-9))
        ax.set_xlabel(f"{UNIT_WORDS[unit]} (mean over seeds)", labelpad=1)
        ax.set_title(setting_name(*s), fontsize=FONT_PT, loc="left")
    _legend(fig, axes, 3, 1.0 - 0.02 / height)
    return _save(fig, out_dir, "time_breakdown")


# ----------------------------------------------------------------------------- cluster sizes


def _main_first(rep: Report) -> list[Cell]:
    """The cells in table order, those of the compact main table first (the figures that show
    only a few cells show those)."""
    return sorted(rep.cells, key=lambda c: not in_main(c))


def _indexed_cells(rep: Report, kind: str, most: int) -> list[tuple[Cell, list[int]]]:
    """The first `most` cells (main ones first) whose runs have `<kind>/<k>` diagnostic rows
    (clusters, workers), each with its sorted indices k: a few cells keep a figure readable."""
    out = []
    for c in _main_first(rep):
        ks = sorted(
            {
                int(b.split("/")[1])
                for r in c.runs
                for (b, _) in r.diag
                if b.startswith(f"{kind}/") and b.split("/")[1].isdigit()
            }
        )
        if ks:
            out.append((c, ks))
    return out[:most]


def cluster_sizes(rep: Report, out_dir: Path) -> list[Path]:
    cc = _indexed_cells(rep, "cluster", 4)
    ncols = 1 if len(cc) <= 1 else 2
    nrows = max(1, math.ceil(len(cc) / ncols))
    width = COLUMN_IN if ncols == 1 else PAGE_IN
    top, panel_h, gap = 0.62, 1.6, 0.75
    height = top + nrows * panel_h + (nrows - 1) * gap + 0.42
    fig, axes = _figure(nrows, ncols)
    _layout(
        fig, width, height, nrows, ncols, left=0.72, right=0.1, bottom=0.42, top=top, hspace=gap, wspace=0.8
    )
    if not cc:
        _empty(axes[0], "clustering runs")
    for ax in axes[len(cc) :]:
        if cc:
            ax.set_axis_off()
    kinds = (
        ("size_before_cap", "k-means"),
        ("size_after_cap", "after the soft cap"),
        ("kept", "kept (after pruning)"),
    )
    for ax, (c, ks) in zip(axes, cc):
        width_bar = 0.27
        x = np.arange(len(ks))
        for j, (metric, name) in enumerate(kinds):
            vals = [_val(rep.diag_cell(c, f"cluster/{k}", metric)) or 0.0 for k in ks]
            ax.bar(x + (j - 1) * width_bar, vals, width_bar, label=name, color=COLORS[j])
        ax.set_xticks(x, [str(k) for k in ks])
        ax.set_xlabel("cluster (= worker)", labelpad=1)
        ax.set_ylabel("examples")
        seeds = f"{len(c.runs)} seed" + ("s" if len(c.runs) > 1 else "")
        ax.set_title(
            f"{cell_method_name(c)}, {seeds}\n{setting_name(c.first.dataset, '', c.first.world_size)}",
            fontsize=FONT_PT,
        )
    _legend(fig, axes, 3, 1.0 - 0.02 / height)
    return _save(fig, out_dir, "cluster_sizes")


# ----------------------------------------------------------------------------- worker balance


def worker_balance(rep: Report, out_dir: Path) -> list[Path]:
    """Per worker: tokens per step, and the all-reduce wait as a share of the step (the total
    wait over the total step time, so runs of any length compare; n/a under fsdp)."""
    cells = _indexed_cells(rep, "worker", 6)
    names = [
        f"{cell_method_name(c)} · {setting_name(c.first.dataset, '', c.first.world_size)}"
        + (" (wait: n/a, fsdp)" if rep.fsdp(c) else "")
        for c, _ in cells
    ]
    # Two legend columns where the names fit in half the width (about 0.062 in per character).
    legend_cols = 2 if max((len(n) for n in names), default=0) * 0.062 + 0.5 < PAGE_IN / 2 else 1
    legend_h = LINE_IN * _legend_rows(len(cells), legend_cols) + 0.1
    height = 0.15 + 1.8 + 0.42 + legend_h
    fig, axes = _figure(1, 2)
    _layout(fig, PAGE_IN, height, 1, 2, left=0.55, right=0.1, bottom=0.42 + legend_h, top=0.15, wspace=0.7)
    if not cells:
        _empty(axes[0], "per-worker logs")
        axes[1].set_axis_off()
        return _save(fig, out_dir, "worker_balance")
    width = 0.8 / len(cells)
    any_fsdp = False
    for i, ((c, ks), label) in enumerate(zip(cells, names)):
        x = np.asarray(ks, dtype=float) + (i - (len(cells) - 1) / 2) * width
        tok = [_val(rep.diag_cell(c, f"worker/{k}", "tokens_per_step")) or 0.0 for k in ks]
        fsdp = rep.fsdp(c)
        any_fsdp |= fsdp
        color = COLORS[i % len(COLORS)]
        axes[0].bar(x, tok, width, color=color, label=label)
        if not fsdp:  # not measured under fsdp: no bar, never a 0
            share = []
            for k in ks:
                w = _val(rep.diag_cell(c, f"worker/{k}", "allreduce_wait_s"))
                comp = _val(rep.diag_cell(c, f"worker/{k}", "compute_s"))
                share.append(100 * w / (w + comp) if w is not None and comp and w + comp > 0 else 0.0)
            axes[1].bar(x, share, width, color=color)
    axes[0].set_ylabel("tokens per optimizer step")
    axes[1].set_ylabel("all-reduce wait (% of step time)")
    axes[1].set_ylim(0, 100)
    if any_fsdp:
        axes[1].text(
            0.98, 0.97, "n/a (fsdp): wait not measured", ha="right", va="top", transform=axes[1].transAxes
        )
    n_workers = max(max(ks) for _, ks in cells) + 1
    for ax in axes:
        ax.set_xlabel("worker", labelpad=1)
        ax.set_xticks(range(n_workers))
    _legend(fig, axes[:1], legend_cols, legend_h / height)
    return _save(fig, out_dir, "worker_balance")


# ----------------------------------------------------------------------------- step tokens


def step_tokens(rep: Report, out_dir: Path) -> list[Path]:
    """Per optimizer step, each worker's tokens (from the schedule, known before training), for
    up to four cells (main ones first; each cell's first seed) whose run folders hold
    step_tokens.json: in every step the other workers wait for the top line, and the predicted
    idle share in each title is the mean over steps of 1 - mean/max of the lines."""
    cells = []
    for c in _main_first(rep):
        run = next((r for r in c.runs if r.step_tokens and len(r.step_tokens[0]) > 1), None)
        if run is not None:
            cells.append((c, run))
    cells = cells[:4]
    ncols = 1 if len(cells) <= 1 else 2
    nrows = max(1, math.ceil(len(cells) / ncols))
    workers = max((len(r.step_tokens[0]) for _, r in cells), default=0)
    legend_cols = min(4, max(1, workers))
    legend_h = LINE_IN * _legend_rows(workers, legend_cols) + 0.1
    # Titles take up to three lines: the method (wrapped to the panel), the setting and idle.
    top, panel_h, gap, bottom = 0.15 + legend_h + 0.45, 1.6, 0.95, 0.42
    height = top + nrows * panel_h + (nrows - 1) * gap + bottom
    fig, axes = _figure(nrows, ncols)
    _layout(
        fig,
        COLUMN_IN if ncols == 1 else PAGE_IN,
        height,
        nrows,
        ncols,
        left=0.62,
        right=0.1,
        bottom=bottom,
        top=top,
        hspace=gap,
        wspace=0.75,
    )
    if not cells:
        _empty(axes[0], "per-step token sums (run folders' step_tokens.json)")
    for ax in axes[len(cells) :]:
        if cells:
            ax.set_axis_off()
    for ax, (c, run) in zip(axes, cells):
        sums = np.asarray(run.step_tokens, dtype=float)
        x = np.arange(1, sums.shape[0] + 1)
        marker = sums.shape[0] <= 30  # markers only where they stay apart
        for k in range(sums.shape[1]):
            ax.plot(
                x,
                sums[:, k],
                color=COLORS[k % len(COLORS)],
                linewidth=0.9,
                marker=MARKERS[k % len(MARKERS)] if marker else None,
                markersize=3,
                label=f"worker {k}",
            )
        ax.set_ylim(0, 1.1 * sums.max())
        ax.set_xlim(0.5, sums.shape[0] + 0.5)
        ax.set_xlabel("optimizer step", labelpad=1)
        ax.set_ylabel("tokens per step")
        idle = 100 * idle_share(sums)
        where = f"{setting_name(c.first.dataset, '', c.first.world_size)} · seed {run.seed}"
        ax.set_title(
            textwrap.fill(cell_method_name(c), 44)
            + "\n"
            + textwrap.fill(f"{where}; predicted idle {idle:.1f}%", 52),
            fontsize=FONT_PT,
        )
    _legend(fig, axes, legend_cols, 1.0 - 0.02 / height)
    return _save(fig, out_dir, "step_tokens")


def all_figures(rep: Report, out_dir: Path, reported: list[dict[str, Any]] | None = None) -> list[Path]:
    """Write every figure as PNG and PDF into out_dir; returns the paths. reported: the paper's
    entries (reports/reported.yaml), drawn beside ours where the setting matches."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    paper = paper_cells(reported or [])
    paths: list[Path] = []
    with matplotlib.rc_context(RC):
        paths += quality_vs_data(rep, out_dir, paper)
        for fn in (time_breakdown, cluster_sizes, worker_balance, step_tokens):
            paths += fn(rep, out_dir)
    return paths
