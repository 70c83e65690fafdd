"""CluSTER's clustering steps 2-6, 8 and 9 (method.md), as properties over random features."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from method import clustering as C
from repro.core.interfaces import SelectionError


def _skewed(n: int, d: int, k: int, seed: int, dup: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d)) * 3
    sizes = rng.dirichlet(np.full(k, 0.4)) * n  # skewed cluster sizes
    lab = np.repeat(np.arange(k), np.maximum(1, np.round(sizes).astype(int)))[:n]
    lab = np.concatenate([lab, np.zeros(n - len(lab), dtype=int)])
    X = (centers[lab] + rng.normal(size=(n, d))).astype(np.float32)
    if dup:
        X[: n // 3] = X[0]  # many identical points: ties everywhere
    return X


@settings(max_examples=30, deadline=None)
@given(n=st.integers(8, 120), d=st.integers(2, 8), k=st.integers(1, 6), seed=st.integers(0, 999),
       dup=st.booleans())
def test_soft_cap_matches_the_reference_and_holds(n: int, d: int, k: int, seed: int, dup: bool) -> None:
    k = min(k, n)
    X = _skewed(n, d, k, seed, dup)
    rng = np.random.default_rng(seed)
    centers = X[rng.choice(n, size=k, replace=False)]
    labels = np.argmin(((X[:, None, :] - centers[None]) ** 2).sum(-1), axis=1)
    got = C.soft_cap_assign(X, centers, labels, 1.5)
    ref = C.soft_cap_assign_reference(X, centers, labels, 1.5)
    assert np.array_equal(got, ref)
    if np.bincount(labels, minlength=k).max() > 1.5 * n / k:
        assert np.bincount(got, minlength=k).max() <= math.ceil(1.5 * n / k)
    else:
        assert np.array_equal(got, labels)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(20, 150), k=st.integers(1, 5), ratio=st.sampled_from([100, 75, 50]),
       mode=st.sampled_from(["close", "far", "rand", "mix", "big"]), seed=st.integers(0, 999))
def test_budget_choice_and_weights(n: int, k: int, ratio: int, mode: str, seed: int) -> None:
    X = C.normalize_features(_skewed(n, 6, k, seed), k)
    labels, centers, _ = C.kmeans(X, k, seed, n_init=2, max_iter=50)
    labels = C.soft_cap_assign(X, centers, labels, 1.5)
    sizes = np.bincount(labels, minlength=k)
    if sizes.min() * ratio // 100 == 0:
        with pytest.raises(SelectionError):
            C.balanced_budget(sizes, ratio)
        return
    m, m_adj = C.balanced_budget(sizes, ratio)
    assert m == sizes.min() and m_adj == m * ratio // 100
    chosen = C.choose_within_cluster(X, centers, labels, m_adj, mode, seed)
    assert sum(len(v) for v in chosen.values()) == k * m_adj  # kept count = K * m_adj
    dist = C.sq_distances_to_own_center(X, centers, labels)
    for c, rows in chosen.items():
        assert len(set(rows.tolist())) == m_adj and (labels[rows] == c).all()
        rest = np.setdiff1d(np.flatnonzero(labels == c), rows)
        if len(rest) and mode == "close":  # the paper's default keeps the farthest ("peripheral")
            assert dist[rows].min() >= dist[rest].max() - 1e-6
        if len(rest) and mode == "far":
            assert dist[rows].max() <= dist[rest].min() + 1e-6
    assert C.choose_within_cluster(X, centers, labels, m_adj, mode, seed).keys() == chosen.keys()
    w = C.rank_weights(sizes, n)
    assert np.allclose(w, k * sizes / n) and abs(w.sum() - k) < 1e-9


def test_drop_last_rounding_and_ratio_errors() -> None:
    assert C.balanced_budget([10, 13, 7], 100) == (7, 7)
    assert C.balanced_budget([10, 13, 7], 100, micro_batch=4, drop_last=True) == (7, 4)
    with pytest.raises(SelectionError, match="ratio"):
        C.balanced_budget([10, 10], 150)
    with pytest.raises(SelectionError):
        C.balanced_budget([1, 10], 50)  # m_adj = 0


def test_normalization_and_bad_features() -> None:
    X = np.random.default_rng(0).normal(size=(20, 5)).astype(np.float32)
    assert np.allclose(np.linalg.norm(C.normalize_features(X, 4), axis=1), 1, atol=1e-5)
    assert np.allclose(C.normalize_features(X, 1).mean(0), 0, atol=1e-5)  # K = 1: centered
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(SelectionError, match="3"):
        C.normalize_features(bad, 4)
    zero = X.copy()
    zero[5] = 0
    with pytest.raises(SelectionError, match="5"):
        C.normalize_features(zero, 4)


def test_kmeans_edge_cases_and_exact_mode_is_sklearn() -> None:
    from sklearn.cluster import KMeans

    X = C.normalize_features(_skewed(200, 8, 4, 1), 4)
    labels, centers, inertia = C.kmeans(X, 4, seed=42)
    ref = KMeans(n_clusters=4, init="k-means++", n_init=10, max_iter=300, random_state=42).fit(X)
    assert np.array_equal(labels, ref.labels_) and abs(inertia - ref.inertia_) < 1e-3 * ref.inertia_
    with pytest.raises(SelectionError, match="larger than the pool"):
        C.kmeans(X[:3], 4, seed=0)
    with pytest.raises(SelectionError):
        C.kmeans(np.ones((10, 3), dtype=np.float32), 2, seed=0)  # one distinct point, K = 2


def test_uniform_upsample_and_agreement() -> None:
    labels = np.array([0, 0, 0, 0, 1, 2, 2])
    up = C.uniform_upsample(labels, 3, seed=0)
    assert all(len(v) == 4 for v in up.values())
    assert set(up[1].tolist()) == {4} and set(up[2].tolist()) == {5, 6}
    assert {k: v.tolist() for k, v in up.items()} == \
        {k: v.tolist() for k, v in C.uniform_upsample(labels, 3, seed=0).items()}
    agree = C.cluster_agreement(labels, ["a", "a", "a", "a", "b", "c", "c"])
    assert agree["nmi"] == pytest.approx(1.0) and agree["ari"] == pytest.approx(1.0)
