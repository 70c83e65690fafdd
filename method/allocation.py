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

`cluster-interleave` with `order: authors` uses the authors' random streams instead of the suite's
(method.md step 7, "The authors' exact order"; `authors_order` below), so that a run trains in the
authors' order for the same seed and selection. It is one switch for the user: the `cluster`
selector's `order: authors` records itself in the selection and the allocator follows it.
"""
from __future__ import annotations

import random
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


ORDERS = ("suite", "authors")


def resolve_order(order: str | None, selection: Selection) -> str:
    """The allocator's order: its own `order` parameter, else the one the selection states
    (`info["order"]`, written by the `cluster` selector), else "suite". A parameter that
    contradicts the selection's stated order is an error: the two halves of the authors' order
    (the kept lists' order and the shuffles) only reproduce the authors' run together."""
    stated = selection.info.get("order")
    if order is None:
        return stated if stated in ORDERS else "suite"
    if stated in ORDERS and stated != order:
        raise SelectionError(
            f"allocation.params.order is {order!r} but the selection was made with "
            f"selection.params.order: {stated}; set both to the same value (or leave "
            "allocation.params.order unset: it follows the selection)")
    return order


def authors_order(groups: list[list[str]], seed: int, epochs: int) -> list[list[list[str]]]:
    """The authors' training order (method.md step 7), as order[epoch][worker].

    Kept list c (the cluster's label) is shuffled with Python's `random.Random(seed + c)`; the
    lists are interleaved by label (c0[0], c1[0], ..., c0[1], ...), position i going to worker
    i mod K. Epoch e (epoch 0 included) reshuffles the positions of each residue r mod K with
    `random.Random(seed + e + 12345 + r)`, so a worker keeps its positions. With one worker the
    authors keep the pool order: no shuffle at all. The tail of unequal clusters is dropped so
    that every worker has the same count (lockstep DDP; the balanced budget leaves none)."""
    k = len(groups)
    if k == 1:
        return [[list(groups[0])] for _ in range(epochs)]
    shuffled = []
    for c, members in enumerate(groups):
        members = list(members)
        random.Random(seed + c).shuffle(members)
        shuffled.append(members)
    flat = interleave(shuffled)
    usable = len(flat) // k * k
    order = []
    for e in range(epochs):
        lists = []
        for r in range(k):
            ids = flat[r:usable:k]
            random.Random(seed + e + 12345 + r).shuffle(ids)
            lists.append(ids)
        order.append(lists)
    return order


@register_allocator("cluster-interleave")
class ClusterInterleaveAllocator:
    """Cluster k on worker k: every micro-step holds every cluster (CluSTER, method.md step 7).

    order: null (follow the selection: the authors' order when the `cluster` selector ran with
    `order: authors`, else the suite's), suite (the suite's numpy streams) or authors (the
    authors' Python `random` streams, `authors_order`)."""

    def __init__(self, order: str | None = None) -> None:
        if order is not None and order not in ORDERS:
            raise SelectionError(f"allocation.params.order: {order!r} is not one of "
                                 f"{', '.join(ORDERS)} (or null: follow the selection)")
        self.order = order

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
        order_name = resolve_order(self.order, selection)
        groups = [list(by_cluster[c]) for c in range(k)]
        n_selected = sum(len(g) for g in groups)
        usable = n_selected // k * k  # equal per-worker lengths for lockstep DDP (drop the tail)
        if usable == 0:
            raise SelectionError(f"cluster-interleave: {n_selected} selected examples cannot "
                                 f"give each of {k} workers one")
        if order_name == "authors":
            order = authors_order(groups, seed, epochs)
        else:
            for c, members in enumerate(groups):
                np.random.default_rng([seed, c]).shuffle(members)
            flat = interleave(groups)
            base = [flat[w:usable:k] for w in range(k)]
            order = [base]
            for epoch in range(1, epochs):
                epoch_lists = []
                for w, ids in enumerate(base):
                    ids = list(ids)
                    np.random.default_rng([seed, epoch, w]).shuffle(ids)
                    epoch_lists.append(ids)
                order.append(epoch_lists)
        base = order[0]

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
                        info={"allocator": "cluster-interleave", "order": order_name,
                              "dropped_tail": n_selected - usable,
                              "cluster_sizes": {c: len(g) for c, g in enumerate(groups)}})
