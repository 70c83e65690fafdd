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
selector's `order: authors` records itself in the selection and the allocator follows it. It also
deals as the authors' loader does at any per-device batch B: batch j of the epoch's order to
worker j mod K, so at B > 1 a worker trains several clusters, while the rank weight w_k stays
with worker k. The suite's own order keeps cluster k on worker k at every B.

`cluster-interleave` with `balance: tokens` (allocation.params): cluster k still trains on worker
k, but each optimizer step is balanced in tokens rather than in examples. Every worker's list
(its cluster, shuffled as above; reshuffled each epoch) is cut into the same number of steps S,
at the boundaries that bring each step's token sum closest to the worker's total / S, so a worker
with short examples takes more of them per step. S is what the worker with the fewest examples
gives at per-device batch x accumulation per step (at most its count / accumulation, so every
micro-step of every worker holds an example); nothing is dropped. Steps then carry about equal
tokens on every worker when the clusters' token totals are equal (`selection.params.budget_unit:
tokens`); with unequal totals each worker's steps are even, and the totals' spread remains.
The trainer normalizes such steps per example (repro/core/steps.py step_objective), so rank
weights keep each cluster's share of the objective.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import numpy as np

from repro.core.interfaces import AllocationContext, SelectionError
from repro.core.params import Parameterized, param
from repro.core.registry import register_allocator
from repro.core.types import Schedule, Selection


def rank_example_weights(selection: Selection) -> dict[str, float]:
    """Per-example weights from the selector's group weights (for allocators that mix groups)."""
    if selection.group_weights is None or selection.clusters is None:
        raise SelectionError(
            "allocation.weight_mode 'rank' needs a selector that defines group "
            "weights (e.g. 'cluster'); this selection has none. Use "
            "weight_mode: none"
        )
    return {i: float(selection.group_weights[c]) for i, c in zip(selection.ids, selection.clusters)}


@register_allocator("uniform-shuffle")
class UniformShuffleAllocator(Parameterized):
    """Shuffle, pad to a multiple of K, deal to workers: DistributedSampler's behaviour."""

    params_key = "allocation.params"

    @dataclass
    class Params:
        """No parameters."""

    def allocate(
        self,
        selection: Selection,
        world_size: int,
        seed: int,
        epochs: int = 1,
        weight_mode: str = "none",
        ctx: AllocationContext | None = None,
    ) -> Schedule:
        """`ctx` is not needed: every step takes per-device batch x accumulation examples."""
        n = len(selection.ids)
        if n == 0:
            raise SelectionError("uniform-shuffle: the selection is empty")
        total = -(-n // world_size) * world_size
        import torch  # here, not at import: commands that never allocate start without torch

        order = []
        for epoch in range(epochs):
            g = torch.Generator()
            g.manual_seed(seed + epoch)
            perm = torch.randperm(n, generator=g).tolist()
            perm = (perm * -(-total // n))[:total]  # wrap around (repeatedly), as DistributedSampler pads
            order.append([[selection.ids[i] for i in perm[k:total:world_size]] for k in range(world_size)])
        clusters = (
            {i: int(c) for i, c in zip(selection.ids, selection.clusters)}
            if selection.clusters is not None
            else {}
        )
        example_weights = rank_example_weights(selection) if weight_mode == "rank" else {}
        return Schedule(
            order=order,
            worker_weights=[1.0] * world_size,
            example_weights=example_weights,
            clusters=clusters,
            info={"allocator": "uniform-shuffle", "padded": total - n},
        )


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
            "allocation.params.order unset: it follows the selection)"
        )
    return order


def authors_order(
    groups: list[list[str]], seed: int, epochs: int, per_device_batch: int = 1
) -> tuple[list[list[list[str]]], int]:
    """The authors' training order (method.md step 7), as (order[epoch][worker], padded ids per
    epoch).

    Kept list c (the cluster's label) is shuffled with Python's `random.Random(seed + c)`; the
    lists are interleaved by label (c0[0], c1[0], ..., c0[1], ...). Epoch e (epoch 0 included)
    reshuffles the positions of each residue r mod K with `random.Random(seed + e + 12345 + r)`.
    The epoch's order is then dealt as the authors' loader deals it (method.md "Per-device batch
    B > 1"): global batch j, positions jB .. jB + B - 1, goes to worker j mod K, so at B = 1
    position i goes to worker i mod K (cluster k on worker k) and at B > 1 a worker trains
    several clusters. An incomplete last round of K batches is completed by wrapping around to
    the epoch's first positions, as accelerate's batch sharding does with even batches (the
    authors' loader keeps incomplete batches): every worker gets the same count, and the
    balanced budget needs no padding when B divides m_adj. With one worker the authors keep the
    pool order: no shuffle at all."""
    k, b = len(groups), per_device_batch
    if b < 1:
        raise SelectionError(f"authors_order: per-device batch must be >= 1, got {b}")
    if k == 1:
        return [[list(groups[0])] for _ in range(epochs)], 0
    shuffled = []
    for c, members in enumerate(groups):
        members = list(members)
        random.Random(seed + c).shuffle(members)
        shuffled.append(members)
    flat = interleave(shuffled)
    n = len(flat)
    round_size = k * b  # one batch for every worker
    total = -(-n // round_size) * round_size
    order = []
    for e in range(epochs):
        out = list(flat)
        for r in range(k):
            ids = out[r::k]
            random.Random(seed + e + 12345 + r).shuffle(ids)
            out[r::k] = ids
        out = (out * -(-total // n))[:total]  # wrap around to complete the last round
        batches = [out[j : j + b] for j in range(0, total, b)]
        order.append([[i for batch in batches[w::k] for i in batch] for w in range(k)])
    return order, total - n


def token_balanced_split(lengths: list[int], steps: int, min_size: int) -> list[int]:
    """Sizes of `steps` consecutive chunks of `lengths` (in order), each with at least min_size
    items, whose token sums are as close to sum / steps as the boundaries allow: boundary s sits
    where the running sum is nearest s * sum / steps (within one item's length of it)."""
    n = len(lengths)
    if steps < 1 or n < steps * min_size:
        raise SelectionError(f"cannot cut {n} examples into {steps} steps of at least {min_size}")
    cum = np.cumsum(np.asarray(lengths, dtype=np.float64))
    total = cum[-1]
    bounds = [0]
    for s in range(1, steps):
        target = total * s / steps
        b = int(np.searchsorted(cum, target))  # the first b + 1 items reach the target
        before = cum[b - 1] if b > 0 else 0.0
        count = b + 1 if b < n and cum[b] - target < target - before else b
        count = min(max(count, bounds[-1] + min_size), n - (steps - s) * min_size)
        bounds.append(count)
    bounds.append(n)
    return np.diff(bounds).astype(int).tolist()


@register_allocator("cluster-interleave")
class ClusterInterleaveAllocator(Parameterized):
    """Cluster k on worker k: every micro-step holds every cluster (CluSTER, method.md step 7).

    order: null (follow the selection: the authors' order when the `cluster` selector ran with
    `order: authors`, else the suite's), suite (the suite's numpy streams) or authors (the
    authors' Python `random` streams and their loader's deal of batch j to worker j mod K,
    `authors_order`; cluster k is on worker k only at per-device batch 1).
    balance: none (steps of per-device batch x accumulation examples) or tokens (steps of about
    equal tokens on each worker; needs the token lengths, `ctx`)."""

    params_key = "allocation.params"

    @dataclass
    class Params:
        order: Literal[ORDERS] | None = param(  # type: ignore[valid-type]
            None,
            help="null (follow the selection), suite (the suite's numpy streams) or authors (the "
            "authors' Python random streams)",
        )
        balance: Literal["none", "tokens"] = param(
            "none",
            help="none (steps of per-device batch x accumulation examples) or tokens (steps of about "
            "equal tokens on each worker)",
        )

    def allocate(
        self,
        selection: Selection,
        world_size: int,
        seed: int,
        epochs: int = 1,
        weight_mode: str = "none",
        ctx: AllocationContext | None = None,
    ) -> Schedule:
        if selection.clusters is None:
            raise SelectionError(
                "allocator 'cluster-interleave' needs a selection with clusters (e.g. selector "
                "'cluster'); this selector returns none. Use allocation.method: uniform-shuffle"
            )
        by_cluster: dict[int, list[str]] = defaultdict(list)
        for i, c in zip(selection.ids, selection.clusters):
            by_cluster[int(c)].append(i)
        k = world_size
        if sorted(by_cluster) != list(range(k)):
            raise SelectionError(
                f"allocator 'cluster-interleave' needs clusters 0..{k - 1} (one per worker, "
                f"world_size = {k}); the selection has clusters {sorted(by_cluster)}"
            )
        order_name = resolve_order(self.order, selection)
        if order_name == "authors" and self.balance == "tokens":
            raise SelectionError(
                "allocation.params: order 'authors' and balance 'tokens' cannot "
                "be combined (the authors' order deals equal example counts); "
                "choose one"
            )
        groups = [list(by_cluster[c]) for c in range(k)]
        padded = 0
        if order_name == "authors":
            # Without ctx (a direct call), the paper's per-device batch 1.
            batch = ctx.per_device_batch if ctx is not None else 1
            order, padded = authors_order(groups, seed, epochs, batch)
            dropped = 0
        else:
            for c, members in enumerate(groups):
                np.random.default_rng([seed, c]).shuffle(members)
            if self.balance == "tokens":
                base, dropped = groups, 0  # cluster k on worker k, whatever the cluster sizes
            else:
                flat = interleave(groups)
                usable = len(flat) // k * k  # equal per-worker lengths for lockstep DDP
                if usable == 0:
                    raise SelectionError(
                        f"cluster-interleave: {len(flat)} selected examples "
                        f"cannot give each of {k} workers one"
                    )
                base, dropped = [flat[w:usable:k] for w in range(k)], len(flat) - usable
            order = [base]
            for epoch in range(1, epochs):
                epoch_lists = []
                for w, ids in enumerate(base):
                    ids = list(ids)
                    np.random.default_rng([seed, epoch, w]).shuffle(ids)
                    epoch_lists.append(ids)
                order.append(epoch_lists)
        base = order[0]
        info = {
            "allocator": "cluster-interleave",
            "order": order_name,
            "dropped_tail": dropped,
            "padded": padded,
            "cluster_sizes": {c: len(g) for c, g in enumerate(groups)},
        }
        step_sizes = None
        if self.balance == "tokens":
            step_sizes = self._token_steps(order, ctx)
            info.update(
                balance="tokens",
                steps_per_epoch=len(step_sizes[0][0]),
                worker_tokens=[sum(ctx.lengths[i] for i in ids) for ids in base],
            )

        clusters = {i: int(c) for i, c in zip(selection.ids, selection.clusters)}
        worker_weights = [1.0] * k
        example_weights: dict[str, float] = {}
        if weight_mode == "rank":
            if selection.group_weights is None:
                raise SelectionError(
                    "allocation.weight_mode 'rank' needs a selector that defines "
                    "group weights (e.g. 'cluster'); use weight_mode: none"
                )
            worker_weights = [float(selection.group_weights[c]) for c in range(k)]
            pure = all(clusters[i] == w for w, ids in enumerate(base) for i in ids)
            # Unequal clusters (prune 'none'): the suite's weights follow the example's cluster.
            # The authors' w_k multiplies worker k's loss whatever it trains (B > 1 included).
            if not pure and order_name != "authors":
                example_weights = {i: float(selection.group_weights[c]) for i, c in clusters.items()}
        return Schedule(
            order=order,
            worker_weights=worker_weights,
            example_weights=example_weights,
            clusters=clusters,
            info=info,
            step_sizes=step_sizes,
        )

    @staticmethod
    def _token_steps(order: list[list[list[str]]], ctx: AllocationContext | None) -> list[list[list[int]]]:
        """step_sizes[e][k][s] for `balance: tokens` (see the module's docstring)."""
        if ctx is None:
            raise SelectionError(
                "allocation.params.balance: tokens needs the examples' token "
                "lengths (allocate(..., ctx=AllocationContext(...)); the "
                "pipeline passes them)"
            )
        fewest = min(len(ids) for ids in order[0])
        per_step = ctx.per_device_batch * ctx.grad_accum
        steps = fewest // per_step if ctx.drop_last else -(-fewest // per_step)
        steps = min(steps, fewest // ctx.grad_accum)
        if steps < 1:
            raise SelectionError(
                f"allocation.params.balance: tokens: the smallest worker list has {fewest} "
                f"examples, fewer than one optimizer step of per-device batch x accumulation = "
                f"{per_step}; lower train.global_batch_size or select more data"
            )
        missing = [i for ids in order[0] for i in ids if i not in ctx.lengths]
        if missing:
            raise SelectionError(
                f"balance: tokens: no token length for {len(missing)} selected ids, e.g. {missing[:3]}"
            )
        return [
            [token_balanced_split([ctx.lengths[i] for i in ids], steps, ctx.grad_accum) for ids in lists]
            for lists in order
        ]
