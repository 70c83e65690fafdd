"""`selection.params.clusters_per_worker` (method/packing.py): C x K clusters packed onto K workers,
the budget and the rank weights per worker; C = 1 is the paper's method.

The selector runs here on features written to its cache file (what the feature pass writes), so
no model runs: the feature pass itself is tested in test_cluster_selector.py and test_features.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from method import clustering as C
from method.allocation import ClusterInterleaveAllocator
from method.kmeans import kmeans
from method.packing import Packing, merge_by_worker, pack_clusters, split_budget
from method.rows import normalize_features
from repro.core.config.builder import ConfigError
from repro.core.config.load import from_dict
from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.registry import SELECTORS
from repro.core.types import Example, Pool
from tests.feature_helpers import plant_features


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 9), c=st.integers(2, 5), data=st.data())
def test_packing_gives_every_worker_a_cluster_and_near_equal_totals(k: int, c: int, data) -> None:
    sizes = np.array(data.draw(st.lists(st.integers(1, 500), min_size=k * c, max_size=k * c)))
    p = pack_clusters(sizes, k)
    assert p.worker_of.shape == sizes.shape and set(p.worker_of.tolist()) == set(range(k))
    assert np.array_equal(p.sizes, np.bincount(p.worker_of, sizes, k).astype(np.int64))
    # Greedy onto the least-loaded worker: no two workers differ by more than the largest cluster.
    assert p.sizes.max() - p.sizes.min() <= sizes.max()
    assert np.array_equal(pack_clusters(sizes, k).worker_of, p.worker_of)  # deterministic


def test_packing_is_largest_first_onto_the_least_loaded_worker() -> None:
    # Sizes 5, 4, 3, 3, 2, 1 in that order (clusters 0, 2, 4, 5, 3, 1): 5 -> w0, 4 -> w1,
    # 3 -> w1 (4 < 5), 3 -> w0 (5 < 7), 2 -> w1 (7 < 8), 1 -> w0 (8 < 9).
    p = pack_clusters([5, 1, 4, 2, 3, 3], 2)
    assert p.worker_of.tolist() == [0, 0, 1, 1, 1, 0] and p.sizes.tolist() == [9, 9]
    # Ties: the lower cluster index first, onto the lower worker index.
    assert pack_clusters([2, 2, 2, 2], 2).worker_of.tolist() == [0, 1, 0, 1]
    # One cluster per worker (C = 1): cluster c stays on worker c, unsorted sizes and all.
    one = pack_clusters([3, 9, 1, 5], 4)
    assert one.worker_of.tolist() == [0, 1, 2, 3] and one.sizes.tolist() == [3, 9, 1, 5]
    for bad, k in (([3, 4, 5], 2), ([], 1), ([1, -1], 1)):
        with pytest.raises(SelectionError, match="C x K non-negative cluster sizes"):
            pack_clusters(bad, k)


def test_split_budget_is_proportional_with_largest_remainders() -> None:
    p = Packing(np.array([0, 0, 0, 1]), np.array([10, 7]))
    # Worker 0: 5 x (6, 3, 1) / 10 = 3, 1.5, 0.5; the spare one goes to the lower of the two
    # equal remainders (cluster 1). Worker 1: its one cluster keeps all 5.
    assert split_budget([6, 3, 1, 7], p, 5).tolist() == [3, 2, 0, 5]
    with pytest.raises(SelectionError, match=r"m_adj = 8 per worker must lie in 0\.\.7"):
        split_budget([6, 3, 1, 7], p, 8)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 6), c=st.integers(1, 4), r=st.sampled_from([100, 75, 50, 10]), data=st.data())
def test_split_budget_keeps_m_adj_per_worker_within_each_cluster(k, c, r, data) -> None:
    sizes = np.array(data.draw(st.lists(st.integers(1, 300), min_size=k * c, max_size=k * c)))
    p = pack_clusters(sizes, k)
    m_adj = int(p.sizes.min()) * r // 100
    q = split_budget(sizes, p, m_adj)
    assert (q >= 0).all() and (q <= sizes).all()
    assert np.array_equal(np.bincount(p.worker_of, q, k), np.full(k, m_adj))
    exact = m_adj * sizes / p.sizes[p.worker_of]
    assert (np.abs(q - exact) < 1).all()  # each cluster within one example of its share
    if c == 1:
        assert q.tolist() == [m_adj] * k  # the method's m_adj in every cluster


def _blobs(n: int, d: int, k: int, seed: int) -> np.ndarray:
    """Unequal Gaussian blobs: k-means finds unequal clusters and the cap has work to do."""
    rng = np.random.default_rng(seed)
    lab = rng.choice(k, n, p=rng.dirichlet(np.full(k, 0.7)))
    return (rng.normal(size=(k, d))[lab] * 3 + rng.normal(size=(n, d))).astype(np.float32)


@pytest.mark.parametrize("mode", ["close", "far", "mix", "big", "rand"])
def test_choice_with_per_cluster_counts_matches_the_single_count(mode: str) -> None:
    X = normalize_features(_blobs(90, 5, 3, 1), 3)
    labels, centers, _ = kmeans(X, 3, 0, n_init=2)
    assert np.bincount(labels).min() >= 4
    by_count = {m: C.choose_within_cluster(X, centers, labels, m, mode, 7) for m in (1, 2, 4)}
    mixed = C.choose_within_cluster(X, centers, labels, [2, 4, 1], mode, 7)
    for c, m in enumerate([2, 4, 1]):  # a cluster's choice depends only on its own count
        assert mixed[c].tolist() == by_count[m][c].tolist()
    zero = C.choose_within_cluster(X, centers, labels, [0, 3, 0], mode, 7)
    assert [len(zero[c]) for c in range(3)] == [0, 3, 0]
    for bad in ([1, 2], [1, 2, 10**6], [1, -1, 2]):
        with pytest.raises(SelectionError, match="per-cluster kept counts"):
            C.choose_within_cluster(X, centers, labels, bad, mode, 7)


# ----------------------------------------------------------------------------- the selector


N, D, K = 240, 8, 4


@pytest.fixture(scope="module")
def features_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pool, Path, np.ndarray]:
    """A pool of N examples and its features in the selector's cache file (features.npy with its
    features.json, as the feature pass leaves them)."""
    work = tmp_path_factory.mktemp("packing")
    X = _blobs(N, D, 6, 3)
    pool = Pool([Example(id=f"ex-{i:03d}", prompt="p", response="r", source="t") for i in range(N)])
    plant_features(work, X, pool)
    return pool, work, X


def _select(features_run, **params):
    pool, work, _ = features_run
    cfg = from_dict(
        {},
        [
            f"world_size={K}",
            "train.per_device_batch_size=1",
            f"train.global_batch_size={K}",
            "selection.method=cluster",
        ],
    )
    selector = SELECTORS.create("cluster", {"ratio": 50, **params}, "selection.params")
    ctx = SelectionContext(config=cfg, seed=5, world_size=K, workdir=work)
    return selector.select(pool, None, ctx)


def test_one_cluster_per_worker_is_the_methods_steps(features_run) -> None:
    """C = 1 (the default) is the paper's steps composed directly: K clusters, the cap, m_adj of
    each, weights from cluster sizes."""
    pool, _, X = features_run
    default, explicit = _select(features_run), _select(features_run, clusters_per_worker=1)
    Xn = normalize_features(X, K)
    labels, centers, _ = kmeans(Xn, K, 5)
    capped = C.soft_cap_assign(Xn, centers, labels, 1.5)
    after = np.bincount(capped, minlength=K)
    _, m_adj = C.balanced_budget(after, 50, 1, True)
    chosen = C.choose_within_cluster(Xn, centers, capped, m_adj, "close", 5)
    ids = [pool.ids[int(r)] for c in range(K) for r in chosen[c]]
    for sel in (default, explicit):
        assert sel.ids == ids and sel.clusters == [c for c in range(K) for _ in chosen[c]]
        assert sel.group_weights == {c: float(w) for c, w in enumerate(C.rank_weights(after, N))}
        assert sel.diagnostics.cluster_sizes_after_cap == after.tolist()
        assert sel.diagnostics.cluster_sizes_before_cap == np.bincount(labels, minlength=K).tolist()
        assert "clusters_per_worker" not in sel.info and "worker_of_cluster" not in sel.info
    assert after.max() / after.min() > 1.2  # unequal clusters: the packing below has work to do


def test_more_clusters_per_worker_pack_balance_and_weight_per_worker(features_run) -> None:
    pool, _, X = features_run
    sel = _select(features_run, clusters_per_worker=3)
    info = sel.info
    fine, worker_of = np.array(info["kmeans_sizes_after_cap"]), np.array(info["worker_of_cluster"])
    assert info["clusters_per_worker"] == 3 and fine.size == worker_of.size == 3 * K
    totals = np.bincount(worker_of, fine, K).astype(int)
    assert sel.diagnostics.cluster_sizes_after_cap == totals.tolist() and totals.sum() == N
    assert totals.max() - totals.min() <= fine.max()
    assert info["m"] == totals.min() and info["m_adj"] == totals.min() * 50 // 100
    # Rank weights per worker from the worker's total: w_k = K n_k / N.
    assert sel.group_weights == pytest.approx({k: K * totals[k] / N for k in range(K)})
    # Every worker keeps m_adj, all from its own clusters, shared in proportion to their sizes.
    Xn = normalize_features(X, K)
    labels, centers, _ = kmeans(Xn, 3 * K, 5)
    labels = C.soft_cap_assign(Xn, centers, labels, 1.5)
    assert np.bincount(labels, minlength=3 * K).tolist() == fine.tolist()
    row = {i: r for r, i in enumerate(pool.ids)}
    kept = np.zeros(3 * K, dtype=int)
    for i, w in zip(sel.ids, sel.clusters):
        assert worker_of[labels[row[i]]] == w
        kept[labels[row[i]]] += 1
    assert np.bincount(sel.clusters, minlength=K).tolist() == [info["m_adj"]] * K
    packing = Packing(worker_of, totals)
    assert kept.tolist() == split_budget(fine, packing, info["m_adj"]).tolist()

    # cluster-interleave: group k on worker k, every worker's loss weight its group's.
    sched = ClusterInterleaveAllocator().allocate(sel, K, seed=5, weight_mode="rank")
    group = dict(zip(sel.ids, sel.clusters))
    for w, ids in enumerate(sched.order[0]):
        assert ids and {group[i] for i in ids} == {w}
    assert sched.worker_weights == [sel.group_weights[k] for k in range(K)]
    assert sched.example_weights == {}  # pure groups: the worker weight is the example weight


def test_uniform_variant_upsamples_worker_groups(features_run) -> None:
    sel = _select(features_run, clusters_per_worker=2, variant="uniform")
    totals = sel.diagnostics.cluster_sizes_after_cap
    assert np.bincount(sel.clusters, minlength=K).tolist() == [max(totals)] * K
    assert sel.diagnostics.with_replacement and set(sel.group_weights.values()) == {1.0}


def test_merge_keeps_cluster_order_within_a_worker() -> None:
    p = Packing(np.array([1, 0, 1]), np.array([1, 3]))
    merged = merge_by_worker({0: np.array([4, 5]), 1: np.array([9]), 2: np.array([7])}, p)
    assert merged[0].tolist() == [9] and merged[1].tolist() == [4, 5, 7]


def test_clusters_per_worker_must_be_a_positive_integer() -> None:
    for bad in (0, -2, 1.5, "2", True):
        with pytest.raises(
            ConfigError,
            match=r"^selection\.params\.clusters_per_worker: expected an integer",
        ):
            SELECTORS.create("cluster", {"clusters_per_worker": bad}, "selection.params")
    assert SELECTORS.create("cluster", {}, "selection.params").clusters_per_worker == 1
