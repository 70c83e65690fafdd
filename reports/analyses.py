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

import numpy as np

from reports.load import Kept, load_kept
from reports.runs import RAW_METRICS, Run, is_diagnostic
from reports.stats import jaccard, spearman, variance_split
from reports.values import Column, Report, Table

MIN_COMMON = 3  # fewest common scored examples a rank correlation is computed on


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


def group_names(group: list[Kept]) -> list[str]:
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
        names = group_names(group)
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
        "CPU these are process-hours). selection h: the select and schedule stages (selection_s, "
        "with a feature pass reused from a shared features job), "
        "of which features h is the feature pass (cost/features). train h saved: the full-data "
        "run's training at the same dataset, model, workers and seed minus this run's, mean over "
        "seeds. break-even trainings: selection h / train h saved, how many trainings on the "
        "selection pay its cost back (below 1: the first does; never: no training time saved)."
    ]
    if not rows:
        notes.insert(0, "Skipped (selection_cost): no selection run has a full-data run in its setting.")
    return Table("selection_cost", "Selection cost and break-even against full data", cols, rows, notes=notes)


# ----------------------------------------------------------------------------- all


def analysis_tables(rep: Report) -> tuple[list[Table], list[Kept]]:
    """The five analysis tables (in index order) and the selections they read."""
    runs = [r for c in rep.cells for r in c.runs]
    kept = load_kept(runs)
    have = bool(kept)
    tables = [
        overlap_table(kept, have),
        score_rank_table(kept, have),
        coverage_table(kept, have),
        seed_variance_table(rep),
        cost_table(rep),
    ]
    return tables, kept
