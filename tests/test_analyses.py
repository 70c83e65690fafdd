"""The analyses' math (reports/analyses.py) on small hand-made inputs, and the selection_seed /
training_seed config keys. The analyses on real runs: tests/test_baselines_grid.py."""

from __future__ import annotations

import numpy as np
import pytest

from reports.stats import average_ranks, jaccard, pooled_variance, spearman, variance_split
from repro.core.config import ConfigError, load_config
from tests.conftest import CONFIGS


def test_jaccard_counts_intersection_over_union() -> None:
    assert jaccard({"a", "b", "c"}, {"b", "c", "d"}) == pytest.approx(2 / 4)
    assert jaccard(["a", "a", "b"], ["b", "a"]) == 1.0  # duplicates count once
    assert jaccard({"a"}, {"b"}) == 0.0
    assert jaccard(set(), set()) == 1.0


def test_average_ranks_share_ties() -> None:
    assert average_ranks(np.array([10.0, 30.0, 20.0, 30.0])).tolist() == [1.0, 3.5, 2.0, 3.5]
    assert average_ranks(np.array([5.0, 5.0, 5.0])).tolist() == [2.0, 2.0, 2.0]


def test_spearman_by_hand_and_against_scipy() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # No ties: 1 - 6 Σd² / (n (n² - 1)); ranks y = [2, 1, 4, 3, 5] -> Σd² = 4, rho = 0.8
    assert spearman([1, 2, 3, 4, 5], [2.0, 1.0, 4.0, 3.0, 5.0]) == pytest.approx(0.8)
    # With ties: Pearson of average ranks. x ranks [1.5, 1.5, 3, 4], y ranks [1, 2, 3.5, 3.5]
    rx, ry = np.array([1.5, 1.5, 3, 4]), np.array([1, 2, 3.5, 3.5])
    want = np.corrcoef(rx, ry)[0, 1]
    assert spearman([1, 1, 2, 3], [0.1, 0.2, 0.9, 0.9]) == pytest.approx(want)
    assert spearman([1, 1, 1], [1, 2, 3]) is None  # a constant side has no ranking
    assert spearman([1.0], [2.0]) is None
    with pytest.raises(ValueError, match="pairs"):
        spearman([1, 2], [1, 2, 3])
    from scipy.stats import spearmanr  # scipy is a dependency of the suite (sklearn needs it)

    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.integers(0, 4, 30).astype(float)  # many ties
        y = x + rng.integers(0, 3, 30)
        assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)


def test_pooled_variance_and_the_seed_split() -> None:
    v, df = pooled_variance([[1.0, 3.0], [10.0, 14.0], [7.0]])  # the single value adds nothing
    assert df == 2 and v == pytest.approx((2 + 8) / 2)
    assert pooled_variance([[1.0], [2.0]]) == (None, 0)
    # 2 selection seeds x 2 training seeds: rows = selection seed, columns = training seed.
    vals = {(0, 0): 1.0, (0, 1): 2.0, (1, 0): 5.0, (1, 1): 8.0}
    s = variance_split(vals)
    # across selection seeds within training seed 0: {1, 5} -> var 8; within 1: {2, 8} -> 18
    assert s["var_selection"] == pytest.approx((8 + 18) / 2) and s["df_selection"] == 2
    # across training seeds within selection seed 0: {1, 2} -> 0.5; within 1: {5, 8} -> 4.5
    assert s["var_training"] == pytest.approx((0.5 + 4.5) / 2) and s["df_training"] == 2
    assert s["share_selection"] == pytest.approx(13 / (13 + 2.5))
    assert (s["n_runs"], s["selection_seeds"], s["training_seeds"]) == (4, 2, 2)
    # one axis varied only: the other has no variance (missing, not zero)
    only_sel = variance_split({(0, 7): 1.0, (1, 7): 3.0, (2, 7): 5.0})
    assert only_sel["var_selection"] == pytest.approx(4.0) and only_sel["var_training"] is None
    assert only_sel["share_selection"] is None


def test_seed_axes_default_to_seed_and_keep_the_hash() -> None:
    base = load_config(CONFIGS / "demo-quick.yaml")
    assert base.selection_seed is None and base.training_seed is None
    assert base.seed_for_selection() == base.seed_for_training() == base.seed
    d = base.to_dict()
    for k in ("selection_seed", "training_seed"):
        d.pop(k)
    from repro.core.config import _short_hash  # the hash as it was before the two keys existed

    for k in ("name", "output_dir", "data_dir", "launch", "eval"):
        d.pop(k)
    d["train"].pop("report_to")
    d["train"].pop("schedule_steps")  # its default ("kept"): left out, as the seeds are
    d["train"].pop("length_grouped")  # its default (false): left out likewise
    d["model"].pop("revision")  # null: left out, as these two seeds are (repro/core/config_schema.py)
    d["selection"].pop("matched")  # null unless match_compute_of set it: left out likewise
    d["data"].pop("domain")  # null unless a pool declares its domain: left out likewise
    for src in d["data"]["sources"]:
        src.pop("revision")
        for key in ("min_share", "max_share"):  # the demo source's Params at their defaults
            src["params"].pop(key)
    assert base.hash() == _short_hash(d)
    sel = load_config(CONFIGS / "demo-quick.yaml", ["selection_seed=1"])
    tr = load_config(CONFIGS / "demo-quick.yaml", ["training_seed=1"])
    assert (sel.seed_for_selection(), sel.seed_for_training()) == (1, base.seed)
    assert (tr.seed_for_selection(), tr.seed_for_training()) == (base.seed, 1)
    assert len({base.hash(), sel.hash(), tr.hash()}) == 3  # each is its own run folder
    for key in ("selection_seed", "training_seed"):
        with pytest.raises(ConfigError, match=key):
            load_config(CONFIGS / "demo-quick.yaml", [f"{key}=-1"])
        with pytest.raises(ConfigError, match=key):
            load_config(CONFIGS / "demo-quick.yaml", [f"{key}={2**32}"])


def test_a_selection_seed_gets_its_own_feature_pass_and_an_unset_one_keeps_the_key() -> None:
    from repro.experiments.sharing import feature_key

    over = ["selection.method=cluster"]
    base = load_config(CONFIGS / "demo-quick.yaml", over)
    trained = load_config(CONFIGS / "demo-quick.yaml", [*over, "training_seed=3"])
    selected = load_config(CONFIGS / "demo-quick.yaml", [*over, "selection_seed=3"])
    assert feature_key(base) is not None
    assert feature_key(trained) == feature_key(base)  # features do not depend on training
    assert feature_key(selected) != feature_key(base)  # the selector's draws may


def _run(method: str, n: int, seed: int = 0, **kw) -> object:
    from reports.load import Run

    return Run(
        run_id=f"{method}-{n}-{seed}",
        config_hash="h",
        name=method,
        dataset="d",
        model="m",
        method=method,
        params={},
        allocator="",
        weight_mode="",
        ratio=None,
        world_size=1,
        seed=seed,
        kept_fraction=None,
        n_selected=n,
        n_pool=6,
        costs={},
        lm_eval=None,
        versions={},
        git_sha="",
        selection_seed=kw.get("selection_seed", seed),
        training_seed=seed,
    )


def test_overlap_pairs_only_selections_at_one_budget_and_coverage_falls_back_to_clusters() -> None:
    from reports.analyses import coverage, coverage_table, overlap_table
    from reports.load import Kept

    pool = {f"e{i}": None for i in range(6)}  # no categories: coverage goes by cluster
    clusters = {"e0": 0, "e1": 0, "e2": 1}
    a = Kept(_run("a", 3), "a", ["e0", "e1", "e2"], clusters=clusters, cluster_sizes=[2, 4])
    b = Kept(_run("b", 3), "b", ["e1", "e2", "e3"])
    c = Kept(_run("c", 2), "c", ["e0", "e1"])  # another budget: paired with nobody
    s = Kept(_run("a", 3, selection_seed=5), "a sel-seed=5", ["e3", "e4", "e5"])  # another draw
    for k in (a, b, c, s):
        k.pool_categories = pool
    t = overlap_table([a, b, c, s], True)
    assert [(r[3], r[4], r[5], r[6]) for r in t.rows] == [("a", "b", 2, pytest.approx(2 / 4))]
    by, shares = coverage(a)
    # pool: cluster 0 holds 2 of 6, cluster 1 holds 4; kept: 2 of 3 in cluster 0
    assert by == "cluster" and shares == {
        "0": (pytest.approx(2 / 6), pytest.approx(2 / 3)),
        "1": (pytest.approx(4 / 6), pytest.approx(1 / 3)),
    }
    assert coverage(b) is None  # no categories, no clusters: nothing to split by
    cov = coverage_table([a, b], True)
    assert len(cov.rows) == 2 and not cov.notes[0].startswith("Skipped")
    assert overlap_table([a], True).notes[0].startswith("Skipped (overlap)")
    assert overlap_table([], False).notes[0].startswith("Skipped (overlap): no run folders")


def test_a_bad_pool_line_names_the_file_the_line_and_what_was_expected(tmp_path) -> None:
    from reports.load import ReportInputError, _read_pool

    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"id": "a", "category": "add"}\n\n{"prompt": "no id"}\n')
    with pytest.raises(ReportInputError, match=r"pool\.jsonl:3: expected a JSON example with an id"):
        _read_pool(pool)
    pool.write_text('{"id": "a", "category": "add"}\n{"id": 7}\n')
    assert _read_pool(pool) == {"a": "add", "7": None}
