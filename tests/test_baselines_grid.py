"""The ablation grid (configs/experiments/demo-ablation.yaml) and crossing baselines with CluSTER's
allocator from config alone, through the pipeline's real stages (tiny model, no training)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from repro.core.config.load import from_dict
from repro.core.interfaces import SelectionError
from repro.core.io import read_json
from repro.core.registry import ALLOCATORS, SELECTORS
from repro.experiments.experiment import load_experiment
from repro.pipeline import run_experiment
from tests.baselines_fixtures import BASELINES
from tests.conftest import CONFIGS

GRID = CONFIGS / "experiments" / "demo-ablation.yaml"


@pytest.mark.parametrize("base", [None, CONFIGS / "demo-quick.yaml"])
def test_the_ablation_grid_is_complete_and_every_run_is_valid(base: Path | None) -> None:
    cells = load_experiment(GRID, base=base).cells  # every config loads and validates
    by_label = {c.id: c.check_config() for c in cells}
    for c in cells:  # every selector and allocator exists and accepts its parameters
        cfg = by_label[c.id]
        SELECTORS.create(cfg.selection.method, cfg.selection.params, "selection.params")
        ALLOCATORS.create(cfg.allocation.method, cfg.allocation.params, "allocation.params")
        if c.match_of:
            assert (c.match_of, c.match_by) == ("cluster-r0.5", "kept_count")
    methods = {cfg.selection.method for cfg in by_label.values()}
    assert {"full", "cluster", "uniform"} | BASELINES <= methods
    ref = by_label["cluster-r0.5"]
    assert ref.selection.params["ratio"] == 50 and ref.allocation.weight_mode == "rank"
    matched = {c.id for c in cells if c.match_of == "cluster-r0.5"}
    assert BASELINES <= matched
    cluster_runs = [c for c in by_label.values() if c.selection.method == "cluster"]
    assert {c.selection.params.get("prune", "close") for c in cluster_runs} == {
        "close",
        "far",
        "rand",
        "mix",
        "big",
        "none",
    }
    assert any(
        c.allocation.weight_mode == "none" and c.allocation.method == "cluster-interleave"
        for c in cluster_runs
    )  # CluSTER without weights
    assert any(c.allocation.method == "uniform-shuffle" for c in cluster_runs)  # standard alloc
    assert any(
        c.selection.method not in ("cluster", "uniform") and c.allocation.method == "cluster-interleave"
        for c in by_label.values()
    )


def _quick(tmp_path: Path, *extra: str):
    return from_dict(
        {},
        [
            f"output_dir={tmp_path}",
            "name=x",
            "model.name_or_path=tiny-random-llama",
            "data.sources=[{path: demo, params: {train_size: 64, heldout_per_category: 1}}]",
            "world_size=4",
            "train.per_device_batch_size=1",
            "train.global_batch_size=4",
            *extra,
        ],
    )


def test_a_baseline_runs_under_cluster_interleave_with_rank_weights(tmp_path: Path) -> None:
    """S2L with one cluster per worker, CluSTER's allocator and rank weights, from config alone:
    every worker trains one S2L cluster, weighted by that cluster's share of the pool."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = _quick(
            tmp_path,
            "selection.method=s2l",
            "selection.n=24",
            "selection.params.n_clusters=4",
            "selection.params.epochs=1",
            "allocation.method=cluster-interleave",
            "allocation.weight_mode=rank",
        )
        run_dir = run_experiment(cfg, until="schedule")
        with pytest.raises(SelectionError, match="needs a selection with clusters"):
            run_experiment(
                _quick(
                    tmp_path,
                    "selection.method=loss",
                    "selection.n=24",
                    "allocation.method=cluster-interleave",
                ),
                until="schedule",
            )
    finally:
        torch.set_num_threads(n)
    sel = read_json(run_dir / "selection.json")
    sizes = sel["diagnostics"]["cluster_sizes_before_cap"]
    n_pool = sum(sizes)
    rows = list(csv.DictReader(open(run_dir / "selection.csv")))
    assert rows and {r["worker"] for r in rows} == {"0", "1", "2", "3"}
    for r in rows:
        c = int(r["cluster"])
        assert float(r["weight"]) == pytest.approx(4 * sizes[c] / n_pool, rel=1e-5)
    workers_of = {}
    for r in rows:
        workers_of.setdefault(r["cluster"], set()).add(r["worker"])
    if len(set(sel["info"]["cluster_kept"])) == 1:  # equal clusters: cluster k on worker k
        assert all(len(w) == 1 for w in workers_of.values())


def test_grid_base_option_names_a_missing_file(capsys) -> None:
    from repro.cli import main

    assert main(["grid", str(GRID), "--base", "no/such/base.yaml"]) == 2
    assert (
        "--base 'no/such/base.yaml' not found: no such file, nor a shipped config" in capsys.readouterr().err
    )


# ----------------------------------------------------------------------------- analyses

# A quick grid on the tiny model, one worker, two optimizer steps, held-out loss only: full data,
# random at a count under three seed settings (the seed split's two axes), and five more selectors
# at the same count (four of them scoring). Enough for every analysis of reports/analyses.py.
ANALYSIS_RUNS = {
    "full": ["selection.method=full"],
    "random": ["selection.method=random"],
    "random-sel1": ["selection.method=random", "selection_seed=1"],
    "random-train1": ["selection.method=random", "training_seed=1"],
    "loss": ["selection.method=loss"],
    "perplexity": ["selection.method=perplexity"],
    # the baselines issue 15 added, at the same count
    "rds": ["selection.method=rds", "selection.params.query=heldout"],
    "clusterclip": ["selection.method=clusterclip"],
    "deita-ifd": ["selection.method=deita-ifd"],
}
# the selectors that record per-example scores (random and clusterclip do not), by their label in
# the analyses (method and its non-default params: reports/analyses.py selection_label; query
# heldout is rds's default, so the canonical params leave it out)
RDS = "rds"
SCORING = ("loss", "perplexity", RDS, "deita-ifd")
N_KEPT = 12


def _analysis_cfg(out: Path, name: str, *extra: str):
    return from_dict(
        {},
        [
            f"output_dir={out}",
            f"name={name}",
            "model.name_or_path=tiny-random-llama",
            "data.sources=[{path: demo, params: {train_size: 32, heldout_per_category: 1}}]",
            "eval.benchmarks=[]",
            "world_size=1",
            "train.per_device_batch_size=2",
            "train.global_batch_size=2",
            "train.max_steps=2",
            *([] if name == "full" else [f"selection.n={N_KEPT}"]),
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def analysis_grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The quick grid's output_dir and its report (built through the report command)."""
    from repro.cli import main

    out = tmp_path_factory.mktemp("analysis-grid")
    for name, extra in ANALYSIS_RUNS.items():
        run_experiment(_analysis_cfg(out, name, *extra))
    assert main(["report", "--results", str(out), "--out", str(out / "report")]) == 0
    return out, out / "report"


def _rows(report: Path, name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(open(report / "tables" / f"{name}.csv", encoding="utf-8")))


def test_the_seed_axes_reach_the_stages_and_the_rows(analysis_grid) -> None:
    out, _ = analysis_grid
    from repro.core.results import read_rows

    dirs = {n: _analysis_cfg(out, n, *e).run_dir() for n, e in ANALYSIS_RUNS.items()}
    seeds = {
        n: {(r["seed"], r["selection_seed"], r["training_seed"]) for r in read_rows(d / "results.part.csv")}
        for n, d in dirs.items()
    }
    assert seeds["random"] == {("42", "42", "42")}
    assert seeds["random-sel1"] == {("42", "1", "42")}
    assert seeds["random-train1"] == {("42", "42", "1")}
    randoms = ("random", "random-sel1", "random-train1")
    ids = {n: read_json(dirs[n] / "selection.json")["ids"] for n in randoms}
    assert ids["random-train1"] == ids["random"]  # the training seed does not touch the selection
    assert ids["random-sel1"] != ids["random"]  # the selection seed does
    pools = {(dirs[n] / "pool.jsonl").read_bytes() for n in randoms}
    assert len(pools) == 1  # `seed` alone draws the pool: the three runs share it


def test_the_report_holds_every_analysis_of_the_quick_grid(analysis_grid) -> None:
    from reports.load import load, load_kept
    from reports.stats import jaccard, spearman

    out, report = analysis_grid
    index = (report / "index.md").read_text(encoding="utf-8")
    for name in ("overlap", "score_rank", "coverage", "seed_variance", "selection_cost"):
        assert f"(tables/{name}.md)" in index and (report / "tables" / f"{name}.tex").is_file()
    for fig in ("overlap_jaccard", "score_spearman", "category_coverage"):
        assert f"figures/{fig}.png" in index
        assert (report / "figures" / f"{fig}.png").stat().st_size > 0
        assert (report / "figures" / f"{fig}.pdf").stat().st_size > 0
    from reports.build import build_report

    again = build_report(out, out / "report-again").parent  # the same rows: the same bytes
    for sub, names in (
        ("tables", ("overlap", "score_rank", "coverage", "seed_variance", "selection_cost")),
        ("figures", ("overlap_jaccard", "score_spearman", "category_coverage")),
    ):
        for name in names:
            for ext in ("md", "tex", "csv") if sub == "tables" else ("png", "pdf"):
                f = f"{sub}/{name}.{ext}"
                assert (again / f).read_bytes() == (report / f).read_bytes(), f

    # Overlap: the methods at 12 kept (the sel-seed run is its own budget group), against the
    # kept sets themselves; a selection overlaps itself fully.
    kept = {k.label: k for k in load_kept(load(out).runs)}
    at_count = ("random", "loss", "perplexity", RDS, "clusterclip", "deita-ifd")
    assert {*at_count, "random sel-seed=1"} <= set(kept)
    assert jaccard(kept["loss"].kept, kept["loss"].kept) == 1.0
    overlap = _rows(report, "overlap")
    pairs = {frozenset((r["method A"], r["method B"])): r for r in overlap}
    assert set(pairs) == {frozenset((a, b)) for i, a in enumerate(at_count) for b in at_count[i + 1 :]}
    for pair, r in pairs.items():
        a, b = (kept[x].kept for x in sorted(pair))
        assert float(r["Jaccard"]) == pytest.approx(len(a & b) / len(a | b))
        assert int(r["both kept"]) == len(a & b) and int(r["kept"]) == N_KEPT

    # Score ranks: a row per pair of scoring selectors that share at least 3 scored examples
    # (random and clusterclip record no scores); each rho recomputed from the kept sets' scores.
    ranks = _rows(report, "score_rank")
    assert {frozenset((r["method A"], r["method B"])) for r in ranks} <= {
        frozenset((a, b)) for i, a in enumerate(SCORING) for b in SCORING[i + 1 :]
    }
    ranked = {frozenset((r["method A"], r["method B"])) for r in ranks if int(r["common scored"]) >= 3}
    assert frozenset(("loss", "perplexity")) in ranked
    for rank in ranks:
        a, b = kept[rank["method A"]].scores, kept[rank["method B"]].scores
        common = sorted(a.keys() & b.keys())
        assert int(rank["common scored"]) == len(common)  # 12 of 32 kept each: few in common
        if len(common) < 3:  # too few to rank: the row says so with an empty rho
            assert rank["Spearman rho"] in ("", "—", "n/a")
            continue
        rho = spearman([a[i] for i in common], [b[i] for i in common])
        assert rho is not None and float(rank["Spearman rho"]) == pytest.approx(rho)

    # Coverage: per category of the demo pool; each side adds up to 100% for every selection.
    cov = _rows(report, "coverage")
    assert {r["by"] for r in cov} == {"category"}
    for method in {r["method"] for r in cov}:
        mine = [r for r in cov if r["method"] == method]
        assert sum(float(r["pool (%)"]) for r in mine) == pytest.approx(100.0)
        assert sum(float(r["kept (%)"]) for r in mine) == pytest.approx(100.0)

    # Seed split: the random cell varies both axes; each has one degree of freedom here.
    # (the per-category held-out losses, heldout/<category>, get their own rows)
    rows = _rows(report, "seed_variance")
    assert {r["benchmark"] for r in rows if r["metric"] == "loss"} >= {"heldout", "heldout/add"}
    split = [r for r in rows if (r["benchmark"], r["metric"]) == ("heldout", "loss")]
    assert len(split) == 1 and split[0]["method"].startswith("random")
    s = split[0]
    assert (s["runs"], s["selection seeds"], s["training seeds"]) == ("3", "2", "2")
    assert (s["df sel"], s["df train"]) == ("1", "1")
    assert float(s["var over selection seeds"]) >= 0 and float(s["var over training seeds"]) >= 0

    # Cost: every selection cell against the full run; saved = full train h - train h.
    cost = {r["method"].split(" @")[0].split(" (")[0]: r for r in _rows(report, "selection_cost")}
    assert set(cost) == {"random", "loss", "perplexity", "rds", "clusterclip", "deita-ifd"}
    for r in cost.values():
        saved = float(r["full train h"]) - float(r["train h"])
        assert float(r["train h saved"]) == pytest.approx(saved, rel=1e-6, abs=1e-12)
        if saved > 0:
            want = float(r["selection h"]) / saved
            assert float(r["break-even trainings"]) == pytest.approx(want, rel=1e-6)
