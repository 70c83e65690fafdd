"""The ablation grid (configs/runs/demo-ablation.yaml) and crossing baselines with CluSTER's
allocator from config alone, through the pipeline's real stages (tiny model, no training)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from repro.core.config import from_dict
from repro.core.interfaces import SelectionError
from repro.core.io import read_json
from repro.core.registry import ALLOCATORS, SELECTORS
from repro.experiments.runlists import load_run_list, run_configs
from repro.pipeline import run_experiment
from tests.conftest import CONFIGS

GRID = CONFIGS / "runs" / "demo-ablation.yaml"


@pytest.mark.parametrize("base", [None, CONFIGS / "demo-quick.yaml"])
def test_the_ablation_grid_is_complete_and_every_run_is_valid(base: Path | None) -> None:
    rl = load_run_list(GRID)
    if base is not None:
        rl.base = base
    runs = run_configs(rl)  # every config loads and validates
    by_label = {spec.label: cfg for spec, cfg in runs}
    for spec, cfg in runs:  # every selector and allocator exists and accepts its parameters
        SELECTORS.create(cfg.selection.method, cfg.selection.params, "selection.params")
        ALLOCATORS.create(cfg.allocation.method, cfg.allocation.params, "allocation.params")
        if spec.match_kept_count_of:
            assert spec.match_kept_count_of == "cluster-r0.5"
    methods = {cfg.selection.method for cfg in by_label.values()}
    assert {
        "full",
        "cluster",
        "uniform",
        "random",
        "dedup-exact",
        "dedup-minhash",
        "semdedup",
        "loss",
        "grand",
        "perplexity",
        "ccs",
        "ifd",
        "less",
        "s2l",
        "rds",
        "clusterclip",
        "deita-ifd",
        "deita-perplexity",
    } <= methods
    ref = by_label["cluster-r0.5"]
    assert ref.selection.params["ratio"] == 50 and ref.allocation.weight_mode == "rank"
    matched = {s.label for s, _ in runs if s.match_kept_count_of == "cluster-r0.5"}
    assert {
        "random",
        "dedup-exact",
        "dedup-minhash",
        "semdedup",
        "loss",
        "grand",
        "perplexity",
        "ccs",
        "ifd",
        "less",
        "s2l",
        "rds",
        "clusterclip",
        "deita-ifd",
        "deita-perplexity",
    } <= matched
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
            "data.demo_train_size=64",
            "data.demo_heldout_per_category=1",
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
    sizes = sel["info"]["cluster_sizes"]
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
