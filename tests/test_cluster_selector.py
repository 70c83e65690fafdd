"""The `cluster` selector through the pipeline's select stage (tiny model, 4 gloo workers)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from repro.core.config.builder import ConfigError
from repro.core.config.load import from_dict
from repro.core.interfaces import SelectionError
from repro.core.io import read_json
from repro.core.registry import SELECTORS
from repro.core.rundir import stage_marker
from repro.pipeline import run_experiment


def _cfg(tmp_path: Path, *extra: str):
    return from_dict(
        {},
        [
            f"output_dir={tmp_path}",
            "name=c",
            "model.name_or_path=tiny-random-llama",
            "data.sources=[{path: demo, params: {train_size: 96, heldout_per_category: 1}}]",
            "data.max_length=256",
            "world_size=4",
            "train.per_device_batch_size=1",
            "train.global_batch_size=4",
            "selection.method=cluster",
            "allocation.method=cluster-interleave",
            "allocation.weight_mode=rank",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CluSTER at r = 0.5, K = 4, up to the schedule; the features from K = 4 gloo processes."""
    return run_experiment(
        _cfg(tmp_path_factory.mktemp("cluster"), "selection.params.ratio=50"), until="schedule"
    )


def test_cluster_select_stage_writes_its_files(default_run: Path) -> None:
    run_dir = default_run
    feats = np.load(run_dir / "features.npy")
    pool_n = read_json(stage_marker(run_dir, "pool"))["n_pool"]
    assert feats.shape[0] == pool_n and feats.dtype == np.float32 and np.isfinite(feats).all()

    sel = read_json(run_dir / "selection.json")
    info, diag = sel["info"], sel["diagnostics"]
    for key in ("m", "m_adj", "kept_fraction"):
        assert key in info, key
    for step in ("features", "clustering", "selection"):  # typed costs, each measured
        assert diag["costs"][step]["seconds"] > 0 and diag["costs"][step]["peak_mem_mb"] > 0, step
    k = 4
    after = diag["cluster_sizes_after_cap"]
    assert len(diag["cluster_sizes_before_cap"]) == k
    assert sum(after) == pool_n and len(after) == k
    assert max(after) <= int(np.ceil(1.5 * pool_n / k))
    assert info["m"] == min(after) and info["m_adj"] == info["m"] * 50 // 100
    assert len(sel["ids"]) == k * info["m_adj"]
    assert abs(info["kept_fraction"] - k * info["m_adj"] / pool_n) < 1e-12
    assert set(diag["category_agreement"]) >= {"nmi", "ari"}
    weights = info["weights"]
    assert np.allclose(weights, [k * n / pool_n for n in after])

    rows = list(csv.DictReader(open(run_dir / "selection.csv")))
    assert {r["worker"] for r in rows} == {"0", "1", "2", "3"}
    for r in rows:
        assert r["cluster"] == r["worker"]  # cluster k on worker k
        assert abs(float(r["weight"]) - weights[int(r["cluster"])]) < 1e-5


def test_fewer_feature_processes_than_k_give_the_same_selection(default_run: Path, tmp_path: Path) -> None:
    """feature_workers=2 with K = 4: 2 processes compute the features, K stays 4 clusters, and
    the features and selection.csv are the default's (K processes) byte for byte."""
    run_dir = run_experiment(
        _cfg(tmp_path, "selection.params.ratio=50", "selection.params.feature_workers=2"), until="schedule"
    )
    assert run_dir != default_run
    meta, ref = (read_json(d / "features.json") for d in (run_dir, default_run))
    assert (meta["workers"], meta["world_size"], ref["workers"], ref["world_size"]) == (2, 2, 4, 4)
    assert [w["batches"] for w in meta["per_worker"]] == [
        -(-ref["batches"] // 2),
        ref["batches"] // 2,
    ]  # whole batches, dealt in turn
    # Bit-equal here; a machine with more cores gives 2 and 4 processes different thread counts,
    # which may move the last bits (tests/test_features.py pins threads for its exact check).
    np.testing.assert_allclose(
        np.load(run_dir / "features.npy"), np.load(default_run / "features.npy"), rtol=1e-6, atol=1e-7
    )
    d = read_json(run_dir / "selection.json")
    sel = d["info"]
    assert (
        sel["k"] == 4
        and len(d["diagnostics"]["cluster_sizes_after_cap"]) == 4
        and sel["feature_workers"] == 2
    )
    # On CPU the default is K = 4 processes.
    assert read_json(default_run / "selection.json")["info"]["feature_workers"] == 4
    assert (run_dir / "selection.csv").read_bytes() == (default_run / "selection.csv").read_bytes()


def test_token_budget_keeps_equal_token_totals_per_cluster(default_run: Path) -> None:
    """budget_unit: tokens on the default run's clusters (its features, reused): every cluster
    keeps, in the order `close` keeps them, examples up to one token budget (r x the smallest
    cluster's token total), so the kept totals differ by less than one example; the examples
    budget's choice and the tokens budget's are prefixes of one order. balance: tokens then gives
    every worker its own cluster and the same number of steps."""
    from method.allocation import ClusterInterleaveAllocator
    from repro.core.config.load import load_config
    from repro.core.interfaces import AllocationContext, SelectionContext
    from repro.core.rundir import model_dir_of
    from repro.core.steps import token_lengths
    from repro.pipeline import load_pool_files

    cfg = load_config(default_run / "config.yaml")
    pool, _ = load_pool_files(default_run)
    ctx = SelectionContext(
        config=cfg, seed=cfg.seed, world_size=4, workdir=default_run, model_dir=model_dir_of(default_run)
    )
    by_examples = SELECTORS.create("cluster", {"ratio": 50}, "selection.params").select(pool, None, ctx)
    assert by_examples.ids == read_json(default_run / "selection.json")["ids"]
    sel = SELECTORS.create("cluster", {"ratio": 50, "budget_unit": "tokens"}, "selection.params").select(
        pool, None, ctx
    )
    info = sel.info
    lengths = token_lengths(pool.examples, model_dir_of(default_run), cfg.data.max_length)
    kept = {c: [i for i, g in zip(sel.ids, sel.clusters) if g == c] for c in range(4)}
    totals = [sum(lengths[i] for i in kept[c]) for c in range(4)]
    assert info["budget_unit"] == "tokens" and info["m_adj"] is None
    assert info["token_budget"] == min(info["cluster_tokens_after_cap"]) * 50 // 100
    assert totals == info["kept_tokens"] and max(totals) <= info["token_budget"]
    assert max(totals) - min(totals) < max(lengths[i] for i in sel.ids)
    assert [len(kept[c]) for c in range(4)] == info["kept_per_cluster"]
    for c in range(4):  # one order: the shorter choice is the start of the longer one
        ex = [i for i, g in zip(by_examples.ids, by_examples.clusters) if g == c]
        short, long_ = sorted((set(ex), set(kept[c])), key=len)
        assert short <= long_
    assert sel.group_weights == by_examples.group_weights  # weights: sizes after the cap

    sched = ClusterInterleaveAllocator(balance="tokens").allocate(
        sel, 4, cfg.seed, weight_mode="rank", ctx=AllocationContext(lengths, 1, 2, True)
    )
    assert {len(s) for s in sched.step_sizes[0]} == {min(info["kept_per_cluster"]) // 2}
    assert [sorted(ids) for ids in sched.order[0]] == [sorted(kept[c]) for c in range(4)]


def test_feature_workers_must_be_a_positive_integer() -> None:
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(
            ConfigError,
            match=r"^selection\.params\.feature_workers: expected (an integer >= 1 or null|int or null)",
        ):
            SELECTORS.create("cluster", {"feature_workers": bad}, "selection.params")
    assert SELECTORS.create("cluster", {"feature_workers": 3}, "selection.params").feature_workers == 3
    assert SELECTORS.create("cluster", {}, "selection.params").feature_workers is None
    assert SELECTORS.create("uniform", {"feature_workers": 1}, "selection.params").inner.feature_workers == 1


def test_feature_workers_do_not_enter_the_shared_feature_key(tmp_path: Path) -> None:
    """slurm/ shares one features file per key: the file does not depend on the process count."""
    from repro.experiments.cells import Cell

    def key(**params):
        data = {
            "output_dir": str(tmp_path),
            "name": "c",
            "world_size": 4,
            "model": {"name_or_path": "tiny-random-llama"},
            "selection": {"method": "cluster", "params": {"ratio": 50, **params}},
        }
        return Cell(id="c", axes={"world_size": 4}, data=data).feature_key()

    assert key() == key(feature_workers=1) == key(feature_workers=2)
    assert key() != key(feature_batch_size=4)  # batch composition does change the last bits


def test_cluster_rejects_a_budget_and_bad_params(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^selection\.params\.ratio: expected a finite number in \(0, 100\]"
    ):
        SELECTORS.create("cluster", {"ratio": 150}, "selection.params")
    with pytest.raises(ConfigError, match="prune"):
        SELECTORS.create("cluster", {"prune": "middle"}, "selection.params")
    cfg = _cfg(tmp_path, "selection.n=10")
    with pytest.raises(SelectionError, match="sets its own kept count"):
        run_experiment(cfg, until="select")


def test_uniform_variant_and_crossing_with_the_standard_allocator(tmp_path: Path) -> None:
    # One feature process (no spawn, so the test is quick): K is still 4 clusters.
    cfg = _cfg(
        tmp_path,
        "selection.params.variant=uniform",
        "allocation.method=uniform-shuffle",
        "allocation.weight_mode=none",
        "selection.params.feature_workers=1",
    )
    run_dir = run_experiment(cfg, until="schedule")
    sel = read_json(run_dir / "selection.json")
    sizes = sel["diagnostics"]["cluster_sizes_after_cap"]
    assert len(sel["ids"]) == 4 * max(sizes)  # every cluster up-sampled to the largest
    assert sel["diagnostics"]["with_replacement"] is True
    sched = read_json(run_dir / "schedule.json")
    mixed = {c for w in sched["order"][0] for c in {sched["clusters"][i] for i in w}}
    assert mixed == {0, 1, 2, 3}
    assert json.loads((run_dir / "features.json").read_text())["workers"] == 1


def test_kmeans_faiss_is_reachable_from_config(default_run: Path, tmp_path: Path) -> None:
    """selection.params.kmeans=faiss clusters with faiss (the `faiss` extra, installed for the
    tests): the selection's clusters are faiss mode's k-means of the run's features. The default
    run's features are copied in (same model and pool), so only the clustering runs here."""
    import shutil

    from method.kmeans import kmeans
    from method.rows import normalize_features
    from repro.core.interfaces import SelectionContext
    from repro.pipeline import load_pool_files

    cfg = _cfg(tmp_path, "selection.params.ratio=50", "selection.params.kmeans=faiss")
    for name in ("features.npy", "features.json"):
        shutil.copy(default_run / name, tmp_path / name)
    train, _ = load_pool_files(default_run)
    selector = SELECTORS.create("cluster", cfg.selection.params, "selection.params")
    sel = selector.select(train, None, SelectionContext(cfg, cfg.seed, 4, tmp_path))
    assert sel.info["kmeans"] == "faiss" and sel.diagnostics.features_reused

    Xn = normalize_features(np.load(tmp_path / "features.npy"), 4, "auto")
    labels, _, inertia = kmeans(Xn, 4, cfg.seed, mode="faiss")
    assert sel.diagnostics.cluster_sizes_before_cap == np.bincount(labels, minlength=4).tolist()
    assert sel.info["inertia"] == pytest.approx(inertia, rel=1e-6)


def test_kmeans_mode_is_checked_and_names_the_modes() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^selection\.params\.kmeans: 'fiass' is not allowed; expected one of "
        r"'exact', 'fast', 'faiss'",
    ):
        SELECTORS.create("cluster", {"kmeans": "fiass"}, "selection.params")
