"""Analyses of what the selectors kept, how their scores agree, where the run-to-run spread comes
from and what selection costs (docs/reports.md, "Analyses").

    overlap         pairwise Jaccard overlap of kept sets at the same budget (same pool, seed,
                    selection seed and kept count)                 figure overlap_jaccard
    score_rank      Spearman rank correlation of per-example selector scores on the examples
                    both runs kept (same pool and seed)           figure score_spearman
    coverage        share of each pool category (else each cluster) in the kept set vs the pool
                                                                  figure category_coverage
    seed_variance   a metric's variance over selection seeds vs over training seeds
    selection_cost  selection device-hours, training device-hours saved against full data, and
                    the number of trainings that pays the selection back

Inputs: the result rows (reports/load.py Run) and, for the first three, each run's folder
`<results>/<name>/<config_hash>/` (selection.json: kept ids, clusters, scores; pool.jsonl: the pool
and its categories). An analysis whose inputs are absent (one method only, no scores, no run
folders, no seed variation) gives an empty table whose note says why, and no figure.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reports.load import RAW_METRICS, ReportInputError, Run, is_diagnostic, read_jsonl
from reports.tables import Column, Report, Table

ANALYSIS_FIGURES = ("overlap_jaccard", "score_spearman", "category_coverage")
MIN_COMMON = 3  # fewest common scored examples a rank correlation is computed on
FIG_GROUPS = 4  # most panels (budgets or pools) one heatmap figure draws


# ----------------------------------------------------------------------------- math


def jaccard(a: set[Any] | list[Any], b: set[Any] | list[Any]) -> float:
    """|A ∩ B| / |A ∪ B| of two kept sets (duplicates count once); two empty sets: 1."""
    a, b = set(a), set(b)
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span (scipy's rankdata 'average')."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(len(x), dtype=np.float64)
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float] | np.ndarray, y: list[float] | np.ndarray) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks (so ties are handled as scipy's
    spearmanr does). None with fewer than two pairs or when either side is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"spearman: {x.shape} vs {y.shape} values, expected pairs")
    if len(x) < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    return None if den == 0 else float((rx * ry).sum() / den)


def pooled_variance(groups: list[list[float]]) -> tuple[float | None, int]:
    """The pooled within-group variance Σ_g Σ_i (x_gi - mean_g)² / Σ_g (n_g - 1) over the groups
    of two or more values, and its degrees of freedom; (None, 0) without such a group."""
    ss, df = 0.0, 0
    for g in groups:
        if len(g) < 2:
            continue
        a = np.asarray(g, dtype=np.float64)
        ss += float(((a - a.mean()) ** 2).sum())
        df += len(a) - 1
    return (ss / df if df else None), df


def variance_split(values: dict[tuple[int, int], float]) -> dict[str, Any]:
    """Split a metric's spread over {(selection_seed, training_seed): value} of runs that differ
    in nothing else. selection: the pooled variance across selection seeds within each training
    seed (runs that differ only in selection_seed); training: the pooled variance across training
    seeds within each selection seed. Each with its degrees of freedom; share_selection:
    selection / (selection + training) when both are known."""
    by_t: dict[int, list[float]] = {}
    by_s: dict[int, list[float]] = {}
    for (s, t), v in sorted(values.items()):
        by_t.setdefault(t, []).append(v)
        by_s.setdefault(s, []).append(v)
    v_sel, df_sel = pooled_variance(list(by_t.values()))
    v_train, df_train = pooled_variance(list(by_s.values()))
    both = v_sel is not None and v_train is not None and (v_sel + v_train) > 0
    return {
        "n_runs": len(values),
        "selection_seeds": len(by_s),
        "training_seeds": len(by_t),
        "var_selection": v_sel,
        "df_selection": df_sel,
        "var_training": v_train,
        "df_training": df_train,
        "share_selection": (v_sel / (v_sel + v_train)) if both else None,  # type: ignore[operator]
    }


# ----------------------------------------------------------------------------- inputs


@dataclass
class Kept:
    """One run's selection, read from its run folder."""

    run: Run
    label: str
    ids: list[str]
    scores: dict[str, float] = field(default_factory=dict)
    clusters: dict[str, int] = field(default_factory=dict)
    pool_categories: dict[str, str | None] = field(default_factory=dict)
    cluster_sizes: list[int] | None = None

    @property
    def kept(self) -> set[str]:
        return set(self.ids)

    @property
    def pool_key(self) -> tuple:
        r = self.run
        return (r.dataset, r.model, r.seed)


def selection_label(r: Run) -> str:
    """What tells one selection from another: the method, its params (r= for CluSTER's ratio),
    the world size for CluSTER (its clusters are dealt per worker) and the selection seed where
    it is not the run's seed."""
    out = r.method
    if r.ratio is not None:
        out += f" r={r.ratio / 100:g}"
    extra = {k: v for k, v in sorted(r.params.items()) if k != "ratio"}
    if extra:
        out += " (" + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")"
    if r.method == "cluster" and r.world_size:
        out += f" K={r.world_size}"
    if r.selection_seed is not None and r.selection_seed != r.seed:
        out += f" sel-seed={r.selection_seed}"
    return out


def _read_pool(path: Path) -> dict[str, str | None]:
    rows = read_jsonl(path, "a JSON example with an id", lambda d: (str(d["id"]), d.get("category")))
    return dict(rows)


def load_kept(runs: list[Run], root: Path | None) -> list[Kept]:
    """The selections of the runs whose folders hold selection.json and pool.jsonl (not full
    data, not the base model), one per (pool, label, kept count): a run that repeats another's
    selection (another training seed, allocator or world size of the same selection) is left
    out."""
    if root is None:
        return []
    out: list[Kept] = []
    seen: set[tuple] = set()
    pools: dict[Path, dict[str, str | None]] = {}
    for r in sorted(runs, key=lambda x: x.run_id):
        if r.method in ("full", "base"):  # a diverged run's selection still counts
            continue
        d = root / r.name / r.config_hash
        sel_path, pool_path = d / "selection.json", d / "pool.jsonl"
        if not sel_path.is_file() or not pool_path.is_file():
            continue
        label = selection_label(r)
        key = (r.dataset, r.model, r.seed, label, r.n_selected)
        if key in seen:
            continue
        seen.add(key)
        try:
            sel = json.loads(sel_path.read_text(encoding="utf-8"))
            ids = [str(i) for i in sel["ids"]]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ReportInputError(f"{sel_path}: expected JSON with a list 'ids' ({e})") from None
        scores_list, clusters_list = sel.get("scores"), sel.get("clusters")
        for name, v in (("scores", scores_list), ("clusters", clusters_list)):
            if v is not None and len(v) != len(ids):
                raise ReportInputError(f"{sel_path}: {name} has {len(v)} entries for {len(ids)} ids")
        scores = (
            {i: float(s) for i, s in zip(ids, scores_list) if s is not None and math.isfinite(float(s))}
            if scores_list
            else {}
        )
        clusters = {i: int(c) for i, c in zip(ids, clusters_list)} if clusters_list else {}
        info = sel.get("info") or {}
        sizes = info.get("cluster_sizes_before_cap") or info.get("cluster_sizes")
        if pool_path not in pools:
            pools[pool_path] = _read_pool(pool_path)
        out.append(
            Kept(
                run=r,
                label=label,
                ids=ids,
                scores=scores,
                clusters=clusters,
                pool_categories=pools[pool_path],
                cluster_sizes=[int(x) for x in sizes] if isinstance(sizes, list) else None,
            )
        )
    return out


def _setting(k: Kept) -> str:
    return f"{k.run.dataset} · {k.run.model}"


# ----------------------------------------------------------------------------- overlap


def overlap_groups(kept: list[Kept]) -> dict[tuple, list[Kept]]:
    """Selections at the same budget: same pool (dataset, model, seed), selection seed and
    number of distinct kept examples; only groups of two or more methods."""
    groups: dict[tuple, list[Kept]] = {}
    for k in kept:
        r = k.run
        groups.setdefault((r.dataset, r.model, r.seed, r.selection_seed, len(k.kept)), []).append(k)
    return {g: v for g, v in sorted(groups.items(), key=lambda x: str(x[0])) if len(v) > 1}


def jaccard_matrix(group: list[Kept]) -> np.ndarray:
    n = len(group)
    m = np.ones((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            m[i, j] = m[j, i] = jaccard(group[i].kept, group[j].kept)
    return m


def overlap_table(kept: list[Kept], have_folders: bool) -> Table:
    cols = [
        Column("setting"),
        Column("seed", "int"),
        Column("kept", "int"),
        Column("method A"),
        Column("method B"),
        Column("both kept", "int"),
        Column("Jaccard", "num"),
    ]
    rows = []
    for (_d, _m, seed, _ss, n), group in overlap_groups(kept).items():
        for i in range(len(group)):
            for j in range(i + 1, len(group)):
                a, b = group[i], group[j]
                rows.append(
                    [_setting(a), seed, n, a.label, b.label, len(a.kept & b.kept), jaccard(a.kept, b.kept)]
                )
    notes = [
        "Jaccard = |A ∩ B| / |A ∪ B| of two runs' kept example ids, for runs on the same pool "
        "(dataset, model, seed), selection seed and number of distinct kept examples; 1: the same "
        "set. Random sets of k out of N overlap by about k / (2N - k)."
    ]
    if not rows:
        notes.insert(0, _absent("overlap", have_folders, "two or more selections at the same kept count"))
    return Table("overlap", "Overlap of kept sets at the same budget (Jaccard)", cols, rows, notes=notes)


def _absent(name: str, have_folders: bool, what: str) -> str:
    if not have_folders:
        return f"Skipped ({name}): no run folders with selection.json next to these results."
    return f"Skipped ({name}): these results hold no {what}."


# ----------------------------------------------------------------------------- scores


def score_groups(kept: list[Kept]) -> dict[tuple, list[Kept]]:
    """Scoring selections on the same pool (dataset, model, seed); groups of two or more."""
    groups: dict[tuple, list[Kept]] = {}
    for k in kept:
        if k.scores:
            groups.setdefault(k.pool_key, []).append(k)
    return {g: v for g, v in sorted(groups.items(), key=lambda x: str(x[0])) if len(v) > 1}


def _names(group: list[Kept]) -> list[str]:
    """Labels, with the kept count where one label appears at several budgets."""
    seen: dict[str, int] = {}
    for k in group:
        seen[k.label] = seen.get(k.label, 0) + 1
    return [f"{k.label} ({len(k.kept)} kept)" if seen[k.label] > 1 else k.label for k in group]


def score_pair(a: Kept, b: Kept) -> tuple[int, float | None]:
    common = sorted(a.scores.keys() & b.scores.keys())
    if len(common) < MIN_COMMON:
        return len(common), None
    return len(common), spearman([a.scores[i] for i in common], [b.scores[i] for i in common])


def score_rank_table(kept: list[Kept], have_folders: bool) -> Table:
    cols = [
        Column("setting"),
        Column("seed", "int"),
        Column("method A"),
        Column("method B"),
        Column("common scored", "int"),
        Column("Spearman rho", "num"),
    ]
    rows = []
    for (_d, _m, seed), group in score_groups(kept).items():
        names = _names(group)
        for i in range(len(group)):
            for j in range(i + 1, len(group)):
                n, rho = score_pair(group[i], group[j])
                rows.append([_setting(group[i]), seed, names[i], names[j], n, rho])
    notes = [
        "Spearman's rank correlation (average ranks for ties) of two selectors' per-example scores "
        "(selection.json `scores`) on the examples both kept and scored; selectors record scores "
        "of their kept examples only, so this compares the rankings where the kept sets meet. "
        f"Missing: fewer than {MIN_COMMON} common examples, or one side constant. The sign "
        "depends on each selector's direction (some keep high scores, some low)."
    ]
    if not rows:
        notes.insert(0, _absent("score_rank", have_folders, "two scoring selectors on one pool"))
    return Table("score_rank", "Rank correlation of selector scores (Spearman)", cols, rows, notes=notes)


# ----------------------------------------------------------------------------- coverage


def coverage(k: Kept) -> tuple[str, dict[str, tuple[float, float]]] | None:
    """('category' or 'cluster', {group: (pool share, kept share)}), shares as fractions that add
    up to 1 on each side; None when neither the pool has categories nor the selection clusters
    with their pool sizes."""
    cats = k.pool_categories
    if cats and any(c is not None for c in cats.values()):
        pool_n: dict[str, int] = {}
        for c in cats.values():
            pool_n[str(c)] = pool_n.get(str(c), 0) + 1
        kept_n: dict[str, int] = {}
        for i in k.kept:
            c = str(cats.get(i))
            kept_n[c] = kept_n.get(c, 0) + 1
        total_p, total_k = sum(pool_n.values()), sum(kept_n.values())
        groups = sorted(pool_n.keys() | kept_n.keys())
        return "category", {g: (pool_n.get(g, 0) / total_p, kept_n.get(g, 0) / total_k) for g in groups}
    if k.clusters and k.cluster_sizes:
        total_p = sum(k.cluster_sizes)
        kept_n = {}
        for i in k.kept:
            c = str(k.clusters[i])
            kept_n[c] = kept_n.get(c, 0) + 1
        total_k = sum(kept_n.values())
        pool_s = {str(c): n / total_p for c, n in enumerate(k.cluster_sizes)}
        groups = sorted(pool_s.keys() | kept_n.keys(), key=lambda x: int(x))
        return "cluster", {g: (pool_s.get(g, 0.0), kept_n.get(g, 0) / total_k) for g in groups}
    return None


def coverage_table(kept: list[Kept], have_folders: bool) -> Table:
    cols = [
        Column("setting"),
        Column("seed", "int"),
        Column("method"),
        Column("kept", "int"),
        Column("by"),
        Column("group"),
        Column("pool (%)", "pct"),
        Column("kept (%)", "pct"),
        Column("kept / pool", "num2"),
    ]
    rows = []
    for k in kept:
        cov = coverage(k)
        if cov is None:
            continue
        by, shares = cov
        for g, (p, q) in shares.items():
            ratio = q / p if p > 0 else None
            rows.append([_setting(k), k.run.seed, k.label, len(k.kept), by, g, 100 * p, 100 * q, ratio])
    notes = [
        "Each selection's share of every pool category (the pool rows' `category`), or, where the "
        "pool has none, of every cluster the selector formed (its cluster sizes in "
        "selection.json), in its kept set and in the pool; each side adds up to 100%. kept / pool: "
        "above 1, the selection over-represents the group."
    ]
    if not rows:
        notes.insert(0, _absent("coverage", have_folders, "selection with pool categories or clusters"))
    return Table("coverage", "Coverage of pool categories by each selection", cols, rows, notes=notes)


# ----------------------------------------------------------------------------- seeds


def _quality_keys(runs: list[Run]) -> list[tuple[str, str]]:
    return sorted({k for r in runs for k in r.scores if not is_diagnostic(k[0])})


def seed_variance_table(rep: Report) -> Table:
    cols = [
        Column("setting"),
        Column("method"),
        Column("seed", "int"),
        Column("benchmark"),
        Column("metric"),
        Column("runs", "int"),
        Column("selection seeds", "int"),
        Column("training seeds", "int"),
        Column("var over selection seeds", "sig"),
        Column("df sel", "int"),
        Column("var over training seeds", "sig"),
        Column("df train", "int"),
        Column("selection share (%)", "pct"),
    ]
    rows = []
    for c in rep.cells:
        by_seed: dict[int, list[Run]] = {}
        for r in c.runs:
            if r.status != "diverged":
                by_seed.setdefault(r.seed, []).append(r)
        for seed, runs in sorted(by_seed.items()):
            axes = {(r.selection_seed, r.training_seed) for r in runs}
            if len(axes) < 2 or len(axes) != len(runs):
                continue  # nothing varied, or two runs with the same seeds (not comparable)
            for b, m in _quality_keys(runs):
                scale = 1.0 if m in RAW_METRICS else 100.0
                vals = {
                    (int(r.selection_seed), int(r.training_seed)): v * scale  # type: ignore[arg-type]
                    for r in runs
                    if (v := r.score(b, m)) is not None
                }
                s = variance_split(vals)
                if s["var_selection"] is None and s["var_training"] is None:
                    continue
                rows.append(
                    [
                        f"{c.first.dataset} · {c.first.model}",
                        c.label(),
                        seed,
                        b,
                        m,
                        s["n_runs"],
                        s["selection_seeds"],
                        s["training_seeds"],
                        s["var_selection"],
                        s["df_selection"],
                        s["var_training"],
                        s["df_training"],
                        None if s["share_selection"] is None else 100 * s["share_selection"],
                    ]
                )
    notes = [
        "Runs of one cell and one `seed` (same pool and model) that differ in selection_seed and/or "
        "training_seed (config keys; unset: seed). var over selection seeds: the pooled "
        "within-group sample variance Σ(x - group mean)² / Σ(n - 1) over groups of runs sharing a "
        "training seed (so they differ only in selection_seed); var over training seeds: the same "
        "over groups sharing a selection seed; df: the pooled degrees of freedom (0: missing). "
        "selection share = var sel / (var sel + var train). Scores in percent, loss and "
        "perplexity as they are."
    ]
    if not rows:
        notes.insert(
            0,
            "Skipped (seed_variance): no cell has runs that differ only in selection_seed or "
            "training_seed (vary them with overrides, e.g. selection_seed=1).",
        )
    return Table("seed_variance", "Variance over selection seeds vs training seeds", cols, rows, notes=notes)


# ----------------------------------------------------------------------------- cost


def _hours(r: Run, col: str) -> float | None:
    v = r.costs.get(col)
    return None if v is None else v * (r.world_size or 1) / 3600


def _mean(vals: list[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return float(np.mean(v)) if v else None


def cost_table(rep: Report) -> Table:
    cols = [
        Column("setting"),
        Column("method"),
        Column("workers", "int"),
        Column("runs", "int"),
        Column("features h", "sig"),
        Column("selection h", "sig"),
        Column("train h", "sig"),
        Column("full train h", "sig"),
        Column("train h saved", "sig"),
        Column("saved / selection", "num2"),
        Column("break-even trainings", "num2"),
    ]
    rows = []
    for c in rep.cells:
        if c.first.method in ("full", "base"):
            continue
        pairs = [(r, rep.reference_run(r, "full")) for r in c.runs if r.status != "diverged"]
        pairs = [(r, f) for r, f in pairs if f is not None and f.run_id != r.run_id]
        if not pairs:
            continue
        feats_s = _mean(
            [
                None if (v := r.diag.get(("cost/features", "seconds"))) is None else v * (r.world_size or 1)
                for r, _ in pairs
            ]
        )
        feats = None if feats_s is None else feats_s / 3600
        sel = _mean([_hours(r, "selection_s") for r, _ in pairs])
        train = _mean([_hours(r, "train_s") for r, _ in pairs])
        full = _mean([_hours(f, "train_s") for _, f in pairs])
        saved = _mean(
            [
                None if (a := _hours(f, "train_s")) is None or (b := _hours(r, "train_s")) is None else a - b
                for r, f in pairs
            ]
        )
        ratio = saved / sel if saved is not None and sel else None
        breakeven = (sel / saved if saved > 0 else "never") if saved is not None and sel is not None else None
        rows.append(
            [
                f"{c.first.dataset} · {c.first.model}",
                c.label(),
                c.first.world_size,
                len(pairs),
                feats,
                sel,
                train,
                full,
                saved,
                ratio,
                breakeven,
            ]
        )
    notes = [
        "Device-hours = seconds x world size / 3600 (the job holds every device for the stage; on "
        "CPU these are process-hours). selection h: the select and schedule stages (selection_s), "
        "of which features h is the feature pass (cost/features). train h saved: the full-data "
        "run's training at the same dataset, model, workers and seed minus this run's, mean over "
        "seeds. break-even trainings: selection h / train h saved, how many trainings on the "
        "selection pay its cost back (below 1: the first does; never: no training time saved)."
    ]
    if not rows:
        notes.insert(0, "Skipped (selection_cost): no selection run has a full-data run in its setting.")
    return Table("selection_cost", "Selection cost and break-even against full data", cols, rows, notes=notes)


# ----------------------------------------------------------------------------- all


def analysis_tables(rep: Report, root: Path | None) -> tuple[list[Table], list[Kept]]:
    """The five analysis tables (in index order) and the selections they read."""
    runs = [r for c in rep.cells for r in c.runs]
    kept = load_kept(runs, root)
    have = bool(kept)
    tables = [
        overlap_table(kept, have),
        score_rank_table(kept, have),
        coverage_table(kept, have),
        seed_variance_table(rep),
        cost_table(rep),
    ]
    return tables, kept


# ----------------------------------------------------------------------------- figures


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
    from reports.figures import COLUMN_IN, PAGE_IN, _figure, _layout, _save

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
        panels.append((f"{d} · seed {seed}", _names(g), m))
    return _heatmap_figure(panels, out_dir, "score_spearman", -1.0, "RdBu_r", "Spearman rho")


def coverage_figure(kept: list[Kept], out_dir: Path) -> list[Path]:
    """Grouped bars for the first pool: the pool's share of each category and each selection's."""
    from reports.figures import COLORS, PAGE_IN, _figure, _layout, _legend, _save

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

    from reports.figures import RC

    matplotlib.use("Agg", force=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    with matplotlib.rc_context(RC):
        for fn in (overlap_figure, spearman_figure, coverage_figure):
            paths += fn(kept, out_dir)
    return paths
