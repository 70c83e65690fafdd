"""Every built-in allocator, in one place: how selected examples are dealt to the K workers.

`uniform-shuffle`: the standard data-parallel allocation (what torch's DistributedSampler does).
Each epoch: a permutation of the selected ids from a generator seeded with seed + epoch, padded
by wrapping around to a multiple of the world size (DistributedSampler's drop_last=False), and
dealt round-robin: worker k gets positions k, k+K, k+2K, ... Every worker then has the same count.

`cluster-interleave`: CluSTER's worker-aware allocation (method.md step 7) and rank weights (step 8).

Each cluster's kept list is shuffled (seeded per cluster), then the lists are interleaved
round-robin, c0, c1, ..., c(K-1), c0, ..., and global position i goes to worker i mod K (what a
DistributedSampler without shuffling does). With equal cluster sizes (CluSTER's balanced budget)
cluster k therefore trains on worker k, and every synchronized micro-step holds the same number of
examples of every cluster, whatever the per-worker batch and accumulation. Each new epoch
reshuffles within each worker's list (positions mod K are kept).

Worker k's loss weight is w_k = K * n_k / N (n_k: cluster k's size after the soft cap, before the
budget trim), so DDP's average of worker gradients follows the original cluster proportions.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from repro.core.interfaces import SelectionError
from repro.core.registry import register_allocator
from repro.core.types import Schedule, Selection


def rank_example_weights(selection: Selection) -> dict[str, float]:
    """Per-example weights from the selector's group weights (for allocators that mix groups)."""
    if selection.group_weights is None or selection.clusters is None:
        raise SelectionError("allocation.weight_mode 'rank' needs a selector that defines group "
                             "weights (e.g. 'cluster'); this selection has none. Use "
                             "weight_mode: none")
    return {i: float(selection.group_weights[c]) for i, c in zip(selection.ids, selection.clusters)}


@register_allocator("uniform-shuffle")
class UniformShuffleAllocator:
    """Shuffle, pad to a multiple of K, deal to workers: DistributedSampler's behaviour."""

    def allocate(self, selection: Selection, world_size: int, seed: int, epochs: int = 1,
                 weight_mode: str = "none") -> Schedule:
        n = len(selection.ids)
        if n == 0:
            raise SelectionError("uniform-shuffle: the selection is empty")
        total = -(-n // world_size) * world_size
        order = []
        for epoch in range(epochs):
            g = torch.Generator()
            g.manual_seed(seed + epoch)
            perm = torch.randperm(n, generator=g).tolist()
            perm += perm[: total - n]  # wrap around, as DistributedSampler pads
            order.append([[selection.ids[i] for i in perm[k:total:world_size]]
                          for k in range(world_size)])
        clusters = ({i: int(c) for i, c in zip(selection.ids, selection.clusters)}
                    if selection.clusters is not None else {})
        example_weights = rank_example_weights(selection) if weight_mode == "rank" else {}
        return Schedule(order=order, worker_weights=[1.0] * world_size,
                        example_weights=example_weights, clusters=clusters,
                        info={"allocator": "uniform-shuffle", "padded": total - n})


def interleave(groups: list[list[str]]) -> list[str]:
    """Round-robin over groups (c0, c1, ..., c0, ...), skipping groups that have run out."""
    out: list[str] = []
    longest = max((len(g) for g in groups), default=0)
    for i in range(longest):
        for g in groups:
            if i < len(g):
                out.append(g[i])
    return out


@register_allocator("cluster-interleave")
class ClusterInterleaveAllocator:
    """Cluster k on worker k: every micro-step holds every cluster (CluSTER, method.md step 7)."""

    def allocate(self, selection: Selection, world_size: int, seed: int, epochs: int = 1,
                 weight_mode: str = "none") -> Schedule:
        if selection.clusters is None:
            raise SelectionError(
                "allocator 'cluster-interleave' needs a selection with clusters (e.g. selector "
                "'cluster'); this selector returns none. Use allocation.method: uniform-shuffle")
        by_cluster: dict[int, list[str]] = defaultdict(list)
        for i, c in zip(selection.ids, selection.clusters):
            by_cluster[int(c)].append(i)
        k = world_size
        if sorted(by_cluster) != list(range(k)):
            raise SelectionError(
                f"allocator 'cluster-interleave' needs clusters 0..{k - 1} (one per worker, "
                f"world_size = {k}); the selection has clusters {sorted(by_cluster)}")
        groups = []
        for c in range(k):
            members = list(by_cluster[c])
            np.random.default_rng([seed, c]).shuffle(members)
            groups.append(members)
        flat = interleave(groups)
        usable = len(flat) // k * k  # equal per-worker lengths for lockstep DDP (drop the tail)
        if usable == 0:
            raise SelectionError(f"cluster-interleave: {len(flat)} selected examples cannot give "
                                 f"each of {k} workers one")
        base = [flat[w:usable:k] for w in range(k)]
        order = [base]
        for epoch in range(1, epochs):
            epoch_lists = []
            for w, ids in enumerate(base):
                ids = list(ids)
                np.random.default_rng([seed, epoch, w]).shuffle(ids)
                epoch_lists.append(ids)
            order.append(epoch_lists)

        clusters = {i: int(c) for i, c in zip(selection.ids, selection.clusters)}
        worker_weights = [1.0] * k
        example_weights: dict[str, float] = {}
        if weight_mode == "rank":
            if selection.group_weights is None:
                raise SelectionError("allocation.weight_mode 'rank' needs a selector that defines "
                                     "group weights (e.g. 'cluster'); use weight_mode: none")
            worker_weights = [float(selection.group_weights[c]) for c in range(k)]
            pure = all(clusters[i] == w for w, ids in enumerate(base) for i in ids)
            if not pure:  # unequal clusters (prune 'none'): weights follow the example's cluster
                example_weights = {i: float(selection.group_weights[c]) for i, c in clusters.items()}
        return Schedule(order=order, worker_weights=worker_weights,
                        example_weights=example_weights, clusters=clusters,
                        info={"allocator": "cluster-interleave", "dropped_tail": len(flat) - usable,
                              "cluster_sizes": {c: len(g) for c, g in enumerate(groups)}})
