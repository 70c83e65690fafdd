"""CluSTER steps 2-6, 8, 9 (method/clustering.py): property tests on small random inputs.

The soft cap is checked against `soft_cap_assign_reference` below: the same rule written as plain
loops, on the same distance matrix.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from method import clustering as C
from method.kmeans import KMEANS_MODES, kmeans
from method.rows import normalize_features, pairwise_sq_distances, sq_distances_to_own_center
from repro.core.interfaces import SelectionError

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One BLAS/OpenMP/torch thread: these inputs are tiny, and on a shared 2-core machine OpenMP
    barriers in small parallel regions cost up to 50x (sklearn KMeans, 2000 x 16: 12 s vs 0.2 s)."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(before)


@st.composite
def features(draw, min_n=2, max_n=300, dup=False):
    """(X, K, seed): random float32 features; with dup, rows are copies of a few distinct rows."""
    n = draw(st.integers(min_n, max_n))
    d = draw(st.integers(1, 16))
    k = draw(st.integers(1, min(n, 12)))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    if dup:
        # few distinct rows, rounded so many distances tie exactly
        X = np.round(X[rng.integers(0, max(1, n // 4), n)], 1)
    return X, k, seed


def skewed(X, k, seed):
    """Centers and labels with one oversized cluster (so the cap triggers)."""
    rng = np.random.default_rng(seed)
    centers = X[rng.integers(0, len(X), k)] + rng.standard_normal((k, X.shape[1]))
    labels = np.where(rng.random(len(X)) < 0.8, 0, rng.integers(0, k, len(X)))
    return centers.astype(np.float32), labels


def nearest(X, k, seed):
    """Centers on K random rows and every row labelled with its nearest one: the partition k-means
    hands the soft cap, with the natural imbalance of the data (the cap may or may not trigger)."""
    centers = X[np.random.default_rng(seed).choice(len(X), size=k, replace=False)]
    return centers, pairwise_sq_distances(X, centers).argmin(axis=1)


def soft_cap_assign_reference(
    X, centers, labels, cap_factor: float = 1.5, n_candidates: int = 8
) -> np.ndarray:
    """The rule of C.soft_cap_assign as plain loops. Uses the same distance matrix
    (pairwise_sq_distances), so both see identical numbers."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    n, k = X.shape[0], np.asarray(centers).shape[0]
    labels = [int(v) for v in labels]
    sizes = [labels.count(c) for c in range(k)]
    if n == 0 or max(sizes) <= cap_factor * n / k:
        return np.array(labels, dtype=np.int64)
    cap = math.ceil(cap_factor * n / k)
    d = pairwise_sq_distances(X, centers).tolist()
    ranked = [sorted(range(k), key=lambda c: (d[i][c], c)) for i in range(n)]
    pairs = []
    for i in range(n):
        for r, c in enumerate(ranked[i][: min(n_candidates, k)]):
            pairs.append((d[i][c], i, r, c))
    pairs.sort()  # by distance, then row index, then candidate rank
    assigned, count = [None] * n, [0] * k
    for _, i, _, c in pairs:
        if assigned[i] is None and count[c] < cap:
            assigned[i] = c
            count[c] += 1
    for i in range(n):
        if assigned[i] is None:
            assigned[i] = next((c for c in ranked[i] if count[c] < cap), ranked[i][0])
            count[assigned[i]] += 1
    return np.array(assigned, dtype=np.int64)


def clustered(X, k, seed):
    """Labels with every cluster non-empty (row i in cluster perm(i) mod K) and per-cluster means:
    the choice rules hold for any partition, so no k-means is needed here."""
    labels = np.random.default_rng(seed).permutation(np.arange(len(X)) % k)
    centers = np.stack([X[labels == c].mean(axis=0) for c in range(k)]).astype(np.float32)
    return labels, centers


# -- step 4: the soft cap ------------------------------------------------------------------------
@SETTINGS
@given(
    features(), st.sampled_from([1.0, 1.2, 1.5, 2.0]), st.integers(1, 9), st.sampled_from([skewed, nearest])
)
def test_soft_cap_matches_reference_and_holds(data, cap_factor, n_cand, partition):
    X, k, seed = data
    centers, labels = partition(X, k, seed)
    got = C.soft_cap_assign(X, centers, labels, cap_factor, n_cand)
    ref = soft_cap_assign_reference(X, centers, labels, cap_factor, n_cand)
    np.testing.assert_array_equal(got, ref)
    assert got.dtype == np.int64 and got.shape == labels.shape
    n = len(X)
    if np.bincount(labels, minlength=k).max() > cap_factor * n / k:
        assert np.bincount(got, minlength=k).max() <= math.ceil(cap_factor * n / k)
    else:
        np.testing.assert_array_equal(got, labels)


@SETTINGS
@given(features(min_n=4, dup=True), st.integers(1, 9))
def test_soft_cap_with_duplicates_and_ties(data, n_cand):
    X, k, seed = data
    rng = np.random.default_rng(seed)
    centers = np.round(X[rng.integers(0, len(X), k)], 0)  # centers on rows: many exact ties
    labels = np.zeros(len(X), dtype=np.int64)
    got = C.soft_cap_assign(X, centers, labels, 1.5, n_cand)
    np.testing.assert_array_equal(got, soft_cap_assign_reference(X, centers, labels, 1.5, n_cand))
    if k > 1:  # all rows in cluster 0 exceeds 1.5 N / K
        assert np.bincount(got, minlength=k).max() <= math.ceil(1.5 * len(X) / k)


def test_soft_cap_untouched_when_balanced_and_stable_order():
    X = np.array([[0.0], [0.0], [1.0], [1.0]], dtype=np.float32)
    centers = np.array([[0.0], [1.0]], dtype=np.float32)
    labels = np.array([0, 0, 1, 1])
    out = C.soft_cap_assign(X, centers, labels)
    np.testing.assert_array_equal(out, labels)
    assert out is not labels
    # 4 rows at the same place, K = 2, cap = ceil(1.5 * 4 / 2) = 3: the first three (row order) fit
    X = np.zeros((4, 1), dtype=np.float32)
    centers = np.array([[0.0], [2.0]], dtype=np.float32)
    out = C.soft_cap_assign(X, centers, np.zeros(4, dtype=np.int64))
    np.testing.assert_array_equal(out, [0, 0, 0, 1])


def test_pairwise_distances_match_naive():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 7)).astype(np.float32)
    cen = rng.standard_normal((3, 7)).astype(np.float32)
    naive = ((X[:, None, :].astype(np.float64) - cen[None].astype(np.float64)) ** 2).sum(-1)
    np.testing.assert_allclose(pairwise_sq_distances(X, cen), naive, rtol=1e-5, atol=1e-5)
    lab = rng.integers(0, 3, 50)
    np.testing.assert_allclose(
        sq_distances_to_own_center(X, cen, lab), naive[np.arange(50), lab], rtol=1e-5, atol=1e-5
    )


# -- steps 5-6 ----------------------------------------------------------------------------------
@SETTINGS
@given(features(min_n=8), st.sampled_from(C.PRUNE_MODES), st.sampled_from([25, 50, 75, 100]))
def test_choose_within_cluster_properties(data, mode, ratio):
    X, k, seed = data
    labels, centers = clustered(X, k, seed)
    sizes = np.bincount(labels, minlength=k)
    assert sizes.min() >= 1
    if math.floor(sizes.min() * ratio / 100) == 0:
        with pytest.raises(SelectionError, match="smallest cluster"):
            C.balanced_budget(sizes, ratio)
        return
    m, m_adj = C.balanced_budget(sizes, ratio)
    assert m == sizes.min() and m_adj == math.floor(m * ratio / 100)
    chosen = C.choose_within_cluster(X, centers, labels, m_adj, mode, seed)
    assert sorted(chosen) == list(range(k))
    kept = sum(len(v) for v in chosen.values())
    assert kept == (len(X) if mode == "none" else k * m_adj)
    dist = sq_distances_to_own_center(X, centers, labels)
    for c, idx in chosen.items():
        assert np.all(labels[idx] == c) and len(set(idx.tolist())) == len(idx)
        assert len(idx) == (sizes[c] if mode == "none" else m_adj)  # every cluster keeps m_adj
        rest = np.setdiff1d(np.flatnonzero(labels == c), idx)
        if mode == "close" and rest.size:
            assert dist[idx].min() >= dist[rest].max()
        if mode == "far" and rest.size:
            assert dist[idx].max() <= dist[rest].min()
        if mode == "big" and rest.size:
            norms = np.linalg.norm(X.astype(np.float64), axis=1)
            assert norms[idx].min() >= norms[rest].max() * (1 - 1e-6)  # float32 products
    # same seed, same output
    again = C.choose_within_cluster(X, centers, labels, m_adj, mode, seed)
    for c in chosen:
        np.testing.assert_array_equal(chosen[c], again[c])


def test_choose_mix_and_rand_seeds():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 4)).astype(np.float32)
    labels, centers = clustered(X, 2, 0)
    dist = sq_distances_to_own_center(X, centers, labels)
    mix = C.choose_within_cluster(X, centers, labels, 5, "mix", 0)
    for c, idx in mix.items():
        ranked = np.flatnonzero(labels == c)[np.argsort(dist[labels == c], kind="stable")]
        assert set(idx[:2].tolist()) == set(ranked[:2].tolist())  # floor(5 / 2) nearest
        assert set(idx[2:].tolist()) == set(ranked[-3:].tolist())  # then 3 farthest
    a = C.choose_within_cluster(X, centers, labels, 20, "rand", 0)
    b = C.choose_within_cluster(X, centers, labels, 20, "rand", 1)
    assert any(set(a[c].tolist()) != set(b[c].tolist()) for c in a)


def test_choose_errors():
    X = np.eye(4, dtype=np.float32)
    labels = np.array([0, 0, 1, 1])
    centers = np.zeros((2, 4), dtype=np.float32)
    with pytest.raises(SelectionError, match="close.*far.*rand"):
        C.choose_within_cluster(X, centers, labels, 1, "peripheral", 0)
    with pytest.raises(SelectionError, match="m_adj = 3"):
        C.choose_within_cluster(X, centers, labels, 3, "close", 0)


def test_balanced_budget_examples():
    assert C.balanced_budget([10, 20, 30], 50) == (10, 5)
    assert C.balanced_budget([10, 13, 7], 100) == (7, 7)  # m is the smallest, wherever it stands
    assert C.balanced_budget([10, 13, 7], 100, micro_batch=4, drop_last=True) == (7, 4)
    assert C.balanced_budget([10, 20, 30], 100) == (10, 10)
    assert C.balanced_budget([101, 200], 75) == (101, 75)
    assert C.balanced_budget(np.array([1000, 1200]), 50, 8, drop_last=True) == (1000, 496)
    assert C.balanced_budget([1000, 1200], 50, micro_batch=8, drop_last=False) == (1000, 500)
    for bad in (0, -5, 100.5, 150):
        with pytest.raises(SelectionError, match="percentage in 1..100"):
            C.balanced_budget([10, 10], bad)
    with pytest.raises(SelectionError, match="m = 1 members"):
        C.balanced_budget([1, 10], 50)
    with pytest.raises(SelectionError, match="micro batch 8"):
        C.balanced_budget([10, 10], 50, micro_batch=8, drop_last=True)


# -- step 8, step 9 -----------------------------------------------------------------------------
@SETTINGS
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=16))
def test_rank_weights(sizes):
    w = C.rank_weights(sizes, sum(sizes))
    assert w.dtype == np.float64
    np.testing.assert_allclose(w, len(sizes) * np.array(sizes) / sum(sizes))
    assert math.isclose(w.sum(), len(sizes), rel_tol=1e-12)


def test_rank_weights_mismatch():
    with pytest.raises(SelectionError, match="summing to N = 10"):
        C.rank_weights([3, 4], 10)


@SETTINGS
@given(st.lists(st.integers(0, 5), min_size=1, max_size=200), st.integers(0, 1000))
def test_uniform_upsample(labels, seed):
    labels = np.array(labels)
    k = int(labels.max()) + 1
    sizes = np.bincount(labels, minlength=k)
    if sizes.min() == 0:
        with pytest.raises(SelectionError, match="empty"):
            C.uniform_upsample(labels, k, seed)
        return
    out = C.uniform_upsample(labels, k, seed)
    again = C.uniform_upsample(labels, k, seed)
    for c in range(k):
        assert len(out[c]) == sizes.max()
        assert np.all(labels[out[c]] == c)
        assert set(np.flatnonzero(labels == c).tolist()) <= set(out[c].tolist())
        np.testing.assert_array_equal(out[c], again[c])


def test_cluster_agreement():
    cats = ["a", "a", "b", "b", "c", "c"]
    for labels in ([0, 0, 1, 1, 2, 2], [2, 2, 0, 0, 1, 1]):
        got = C.cluster_agreement(np.array(labels), cats)
        assert got["nmi"] == pytest.approx(1) and got["ari"] == pytest.approx(1)
        assert got["purity"] == 1
    assert C.cluster_agreement(np.array([0, 1]), None) == {}
    got = C.cluster_agreement(np.array([0, 0, 1, 1]), ["a", "b", None, "b"])
    assert got["n"] == 3 and got["purity"] == pytest.approx(2 / 3)


# -- step 2: normalization ----------------------------------------------------------------------
@SETTINGS
@given(features())
def test_normalize(data):
    X, k, _ = data
    X = X + np.float32(0.01)  # no all-zero rows
    l2 = normalize_features(X, k, "l2")
    np.testing.assert_allclose(np.linalg.norm(l2, axis=1), 1, rtol=1e-5)
    cen = normalize_features(X, 1)  # auto, K = 1: centering
    np.testing.assert_allclose(cen.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(normalize_features(X, 2), l2)  # auto, K > 1: L2
    assert normalize_features(X, 3, "none").dtype == np.float32


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_normalize_rejects_non_finite(bad):
    X = np.ones((10, 3), dtype=np.float32)
    X[7, 1] = bad
    X[9, 0] = bad
    with pytest.raises(SelectionError, match="2 feature row.*row index: 7"):
        normalize_features(X, 2)
    with pytest.raises(SelectionError, match="row index: 7"):
        kmeans(X, 2, 0)


def test_normalize_rejects_zero_rows_and_keeps_large_values():
    X = np.ones((5, 3), dtype=np.float32)
    X[3] = 0
    with pytest.raises(SelectionError, match="row 3"):
        normalize_features(X, 4)
    big = np.full((2, 4), 3e38, dtype=np.float32)  # |x|^2 overflows float32, not float64
    np.testing.assert_allclose(normalize_features(big, 2), 0.5, rtol=1e-6)
    with pytest.raises(SelectionError, match="unknown normalization"):
        normalize_features(X, 2, "unit")


# -- step 3: k-means ----------------------------------------------------------------------------
def test_kmeans_exact_matches_sklearn():
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(3)
    X = rng.standard_normal((400, 8)).astype(np.float32)
    labels, centers, inertia = kmeans(X, 4, 42)
    ref = KMeans(n_clusters=4, init="k-means++", n_init=10, max_iter=300, random_state=42).fit(X)
    np.testing.assert_array_equal(labels, ref.labels_)
    np.testing.assert_array_equal(centers, ref.cluster_centers_)
    assert inertia == ref.inertia_ and labels.dtype == np.int64 and centers.dtype == np.float32


def test_kmeans_errors_and_duplicates():
    X = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    with pytest.raises(SelectionError, match=r"K = world size = 6 is larger than the pool \(5\)"):
        kmeans(X, 6, 0)
    with pytest.raises(SelectionError, match="positive"):
        kmeans(X, 0, 0)
    same = np.ones((50, 4), dtype=np.float32)
    for mode in KMEANS_MODES:
        with pytest.raises(SelectionError, match="only 1 distinct feature rows"):
            kmeans(same, 2, 0, mode=mode)
    # many duplicates but >= K distinct rows: fine, no empty cluster
    dup = np.repeat(np.eye(3, dtype=np.float32), 20, axis=0)
    for mode in KMEANS_MODES:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            labels, _, _ = kmeans(dup, 3, 0, mode=mode)
        assert np.bincount(labels, minlength=3).min() >= 1


@SETTINGS
@given(features(min_n=2))
def test_kmeans_fast_every_cluster_nonempty(data):
    X, k, seed = data
    if np.unique(X, axis=0).shape[0] < k:
        return
    labels, centers, inertia = kmeans(X, k, seed, mode="fast")
    assert np.bincount(labels, minlength=k).min() >= 1 and centers.shape == (k, X.shape[1])
    assert inertia == pytest.approx(sq_distances_to_own_center(X, centers, labels).sum(), rel=1e-4, abs=1e-3)
    again = kmeans(X, k, seed, mode="fast")
    np.testing.assert_array_equal(labels, again[0])


@pytest.mark.parametrize("kind", ["blobs", "unit"])
@pytest.mark.parametrize("k", [4, 8])
def test_kmeans_fast_reaches_exact_inertia(kind, k):
    rng = np.random.default_rng(11)
    n, d = 5000, 64
    if kind == "blobs":
        means = rng.standard_normal((k, d)) * 4
        X = means[rng.integers(0, k, n)] + rng.standard_normal((n, d))
    else:
        X = rng.standard_normal((n, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
    X = X.astype(np.float32)
    _, _, exact = kmeans(X, k, 0)
    _, _, fast = kmeans(X, k, 0, mode="fast", sample=2000)
    assert fast <= exact * 1.005


def test_kmeans_faiss_mode_is_seeded_nonempty_and_near_exact():
    rng = np.random.default_rng(5)
    means = rng.standard_normal((4, 32)) * 4
    X = (means[rng.integers(0, 4, 3000)] + rng.standard_normal((3000, 32))).astype(np.float32)
    labels, centers, inertia = kmeans(X, 4, 1, mode="faiss", n_init=3, max_iter=25)
    assert np.bincount(labels, minlength=4).min() >= 1 and centers.shape == (4, 32)
    assert inertia == pytest.approx(sq_distances_to_own_center(X, centers, labels).sum(), rel=1e-4)
    np.testing.assert_array_equal(labels, kmeans(X, 4, 1, mode="faiss", n_init=3, max_iter=25)[0])
    _, _, exact = kmeans(X, 4, 0)
    assert inertia <= exact * 1.005
