"""The analyses' figures: heatmaps of kept-set overlap and score rank correlation, and the
category coverage bars (reports/analyses.py makes the tables; docs/reports.md, "Analyses").
Beside reports/figures/main.py rather than in it, which holds the main figures and would pass 600
lines with these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from reports.analyses import coverage, group_names, jaccard_matrix, overlap_groups, score_groups, score_pair
from reports.load import Kept

ANALYSIS_FIGURES = ("overlap_jaccard", "score_spearman", "category_coverage")
FIG_GROUPS = 4  # most panels (budgets or pools) one heatmap figure draws


def _heatmap(ax: Any, m: np.ndarray, labels: list[str], title: str, lo: float, cmap: str) -> Any:
    import numpy.ma as ma

    im = ax.imshow(ma.masked_invalid(m), vmin=lo, vmax=1.0, cmap=cmap)
    short = [lab if len(lab) <= 22 else lab[:21] + "…" for lab in labels]
    ax.set_xticks(range(len(labels)), short, rotation=60, ha="right")
    ax.set_yticks(range(len(labels)), short)
    ax.spines[:].set_visible(False)
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            if np.isfinite(m[i, j]) and len(labels) <= 10:
                ax.text(
                    j,
                    i,
                    f"{m[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if m[i, j] > lo + 0.6 * (1 - lo) else "black",
                )
    ax.set_title(title, fontsize=8)
    return im


def _heatmap_figure(
    panels: list[tuple[str, list[str], np.ndarray]],
    out_dir: Path,
    name: str,
    lo: float,
    cmap: str,
    bar_label: str,
) -> list[Path]:
    from reports.figures.style import COLUMN_IN, PAGE_IN, _figure, _layout, _save

    n = len(panels)
    biggest = max(len(lab) for _, lab, _ in panels)
    side = min(2.6, 0.9 + 0.22 * biggest)
    fig, axes = _figure(1, n)
    width = max(COLUMN_IN, min(PAGE_IN, n * (side + 1.4) + 0.6))
    _layout(fig, width, side + 1.6, 1, n, left=1.4, right=0.7, bottom=1.25, top=0.3, wspace=1.4)
    im = None
    for ax, (title, labels, m) in zip(axes, panels):
        im = _heatmap(ax, m, labels, title, lo, cmap)
    if im is not None:
        cb = fig.colorbar(im, ax=axes, fraction=0.04, pad=0.02)
        cb.set_label(bar_label)
    return _save(fig, out_dir, name)


def overlap_figure(kept: list[Kept], out_dir: Path) -> list[Path]:
    groups = list(overlap_groups(kept).items())[:FIG_GROUPS]
    if not groups:
        return []
    panels = [
        (f"{d} · seed {seed} · {n} kept", [k.label for k in g], jaccard_matrix(g))
        for (d, _m, seed, _ss, n), g in groups
    ]
    return _heatmap_figure(panels, out_dir, "overlap_jaccard", 0.0, "Blues", "Jaccard overlap")


def spearman_figure(kept: list[Kept], out_dir: Path) -> list[Path]:
    groups = list(score_groups(kept).items())[:FIG_GROUPS]
    if not groups:
        return []
    panels = []
    for (d, _m, seed), g in groups:
        m = np.eye(len(g))
        for i in range(len(g)):
            for j in range(i + 1, len(g)):
                rho = score_pair(g[i], g[j])[1]
                m[i, j] = m[j, i] = np.nan if rho is None else rho
        panels.append((f"{d} · seed {seed}", group_names(g), m))
    return _heatmap_figure(panels, out_dir, "score_spearman", -1.0, "RdBu_r", "Spearman rho")


def coverage_figure(kept: list[Kept], out_dir: Path) -> list[Path]:
    """Grouped bars for the first pool: the pool's share of each category and each selection's."""
    from reports.figures.style import COLORS, PAGE_IN, _figure, _layout, _legend, _save

    covs = [(k, cov) for k in kept if (cov := coverage(k)) is not None]
    if not covs:
        return []
    first = covs[0][0].pool_key
    covs = [(k, c) for k, c in covs if k.pool_key == first and c[0] == covs[0][1][0]][:7]
    by, shares0 = covs[0][1]
    numeric = by == "cluster"
    groups = sorted({g for _, (_, sh) in covs for g in sh}, key=lambda x: (len(x), x) if numeric else x)
    series = [("pool", [shares0.get(g, (0.0, 0.0))[0] for g in groups])]
    series += [(k.label, [sh.get(g, (0.0, 0.0))[1] for g in groups]) for k, (_, sh) in covs]
    fig, axes = _figure(1, 1)
    ax = axes[0]
    rows = -(-len(series) // 3)
    height = 2.55 + 0.17 * rows
    _layout(fig, PAGE_IN, height, 1, 1, left=0.55, right=0.1, bottom=0.75, top=0.35 + 0.17 * rows)
    width = 0.8 / len(series)
    x = np.arange(len(groups))
    for s, (label, vals) in enumerate(series):
        ax.bar(
            x - 0.4 + width * (s + 0.5),
            [100 * v for v in vals],
            width,
            label=label,
            color="#999999" if s == 0 else COLORS[(s - 1) % len(COLORS)],
        )
    many = len(groups) > 6
    ax.set_xticks(x, groups, rotation=30 if many else 0, ha="right" if many else "center")
    ax.set_ylabel(f"share of {by} (%)")
    ax.set_ylim(0, 100)
    r = covs[0][0].run
    ax.set_title(f"{r.dataset} · {r.model} · seed {r.seed}", fontsize=8)
    _legend(fig, [ax], 3, 1.0 - 0.02 / height)
    return _save(fig, out_dir, "category_coverage")


def analysis_figures(kept: list[Kept], out_dir: Path) -> list[Path]:
    """The analysis figures that have inputs, as PNG and PDF; returns their paths."""
    import matplotlib

    from reports.figures.style import RC

    matplotlib.use("Agg", force=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    with matplotlib.rc_context(RC):
        for fn in (overlap_figure, spearman_figure, coverage_figure):
            paths += fn(kept, out_dir)
    return paths
