"""More k-means clusters than workers: `selection.params.clusters_per_worker: C`.

The method gives each of the K workers one k-means cluster, and every cluster keeps
m_adj = r x the smallest cluster. K is the number of GPUs, and with dozens or hundreds of them the
smallest of K clusters is far below N / K, so the kept fraction K m_adj / N collapses. With C > 1:

1. k-means finds C x K clusters, and the soft cap limits them to 1.5 N / (C K) each;
2. `pack_clusters` puts them onto the K workers, C at a time on average, with balanced totals;
3. the balanced budget applies to the workers: m_adj = r x the smallest worker total, per worker;
4. `split_budget` shares a worker's m_adj among its clusters in proportion to their sizes, and
   each cluster's share is chosen by the prune mode (clustering.choose_within_cluster);
5. rank weights are per worker, w_k = K n_k / N with n_k the worker's total after the cap, so
   DDP's average of worker gradients keeps each worker's share of the pool, and the proportional
   split keeps each cluster's share within its worker.

The schedule is unchanged: one worker per group (the selection's `clusters` are the workers), so
`cluster-interleave` puts group k on worker k. With C = 1 every step is the paper's: one cluster per
worker, cluster k on worker k, every cluster keeping m_adj.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from repro.core.interfaces import SelectionError


@dataclass(frozen=True)
class Packing:
    """Which worker each cluster trains on. `worker_of[c]`: cluster c's worker (0..K-1);
    `sizes[k]`: worker k's total (the sizes of its clusters added up)."""

    worker_of: np.ndarray
    sizes: np.ndarray

    @property
    def k(self) -> int:
        return int(self.sizes.size)

    def clusters_of(self, worker: int) -> np.ndarray:
        """Worker `worker`'s clusters, in increasing cluster index."""
        return np.flatnonzero(self.worker_of == worker)

    def worker_labels(self, labels) -> np.ndarray:
        """Each row's worker, from its cluster label."""
        return self.worker_of[np.asarray(labels, dtype=np.int64)]


def pack_clusters(cluster_sizes, k: int) -> Packing:
    """Clusters onto k workers with balanced totals: greedy largest-first (LPT). Clusters in
    decreasing size (ties: lower index first) each go to the worker with the fewest examples so far
    (ties: the lower worker index). The budget follows the smallest worker, and LPT's smallest
    total is at least 3/4 of the best possible (Deuermeyer, Friesen and Langston, 1982).

    With exactly k clusters there is nothing to balance (one cluster per worker whatever the
    order), and cluster c stays on worker c: the paper's mapping. The number of clusters must be a
    multiple of k, and every worker gets at least one cluster."""
    sizes = np.asarray(cluster_sizes, dtype=np.int64)
    if int(k) != k or k < 1:
        raise SelectionError(f"K = world size = {k} must be a positive integer")
    if sizes.ndim != 1 or sizes.size == 0 or sizes.size % k or (sizes < 0).any():
        raise SelectionError(
            f"packing needs C x K non-negative cluster sizes for K = {k}, got {sizes.tolist()}"
        )
    if sizes.size == k:
        return Packing(np.arange(k, dtype=np.int64), sizes.copy())
    worker_of = np.empty(sizes.size, dtype=np.int64)
    totals = np.zeros(k, dtype=np.int64)
    for c in np.argsort(-sizes, kind="stable").tolist():
        w = int(np.argmin(totals))  # the first minimum: the lowest worker index on ties
        worker_of[c] = w
        totals[w] += sizes[c]
    # k largest-first placements land on k empty workers, so every worker has a cluster.
    return Packing(worker_of, totals)


def split_budget(cluster_sizes, packing: Packing, m_adj: int) -> np.ndarray:
    """Each cluster's kept count when every worker keeps m_adj: worker k's m_adj is shared among
    its clusters in proportion to their sizes, m_adj n_c / n_k, rounded down, and the examples left
    over go one each to the clusters with the largest remainders (ties: the lower cluster index).
    No cluster gets more than its size (m_adj <= n_k). Returns int64 counts per cluster."""
    sizes = np.asarray(cluster_sizes, dtype=np.int64)
    m_adj = int(m_adj)
    if sizes.shape != packing.worker_of.shape:
        raise SelectionError(f"{sizes.size} cluster sizes for a packing of {packing.worker_of.size} clusters")
    if m_adj < 0 or m_adj > packing.sizes.min():
        raise SelectionError(
            f"m_adj = {m_adj} per worker must lie in 0..{packing.sizes.min()} (the smallest worker total)"
        )
    out = np.zeros(sizes.size, dtype=np.int64)
    for w in range(packing.k):
        cl = packing.clusters_of(w)
        exact = m_adj * sizes[cl] / packing.sizes[w]
        base = np.floor(exact).astype(np.int64)
        rest = m_adj - int(base.sum())
        order = np.lexsort((cl, -(exact - base)))  # largest remainder first, then lower index
        base[order[:rest]] += 1
        out[cl] = base
    return out


def merge_by_worker(chosen: dict[int, np.ndarray], packing: Packing) -> dict[int, np.ndarray]:
    """{worker: rows}: each worker's clusters' chosen rows, in cluster index order."""
    return {
        w: np.concatenate([np.asarray(chosen[int(c)], dtype=np.int64) for c in packing.clusters_of(w)])
        for w in range(packing.k)
    }
