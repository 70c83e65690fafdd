"""`uniform-shuffle`: the standard data-parallel allocation (what torch's DistributedSampler does).

Each epoch: a permutation of the selected ids from a generator seeded with seed + epoch, padded
by wrapping around to a multiple of the world size (DistributedSampler's drop_last=False), and
dealt round-robin: worker k gets positions k, k+K, k+2K, ... Every worker then has the same count.
"""
from __future__ import annotations

import torch

from repro.interfaces import SelectionError
from repro.registry import register_allocator
from repro.types import Schedule, Selection


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
