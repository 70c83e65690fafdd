"""The two contracts every method plugs into: `Selector` and `Allocator`.

No base class is needed: any object with the right method works. Any selector can be crossed with
any allocator; that is how the suite separates what a selection buys from what an allocation buys.

    selector.select(pool, budget, ctx) -> Selection        (which examples, optional groups/weights)
    allocator.allocate(selection, world_size, seed, epochs, weight_mode, ctx) -> Schedule
                                                          (each worker's ordered ids, loss weights)

Each declares its parameters as a `Params` dataclass (repro/core/params.py), which the registry
builds from the config's `selection.params` / `allocation.params`.

Optional, for a selector that computes features which depend only on the model and the pool
(not on the budget, the ratio or the world size), so that grid cells can share one pass:

    selector.feature_key(cfg) -> dict | None

A JSON-able mapping of what else identifies the features (CluSTER: {"features": "gradient-proxy",
"feature_batch_size": 8}, from its own defaults), or None when this configuration computes none
worth sharing; no such method is the same as None. Cells with the same model, pool and mapping
share one key (repro/experiments/sharing.py; the seed enters only where it changes the pool or
the model, `pool_seed_uses`): the SLURM launcher computes their pool and
features once and links `features.npy` / `features.json` into each run folder, where the
selector's `select` must reuse them. The shared features job computes one kind today,
"gradient-proxy" (method/features.py, with the mapping's feature_batch_size).

Every allocator takes `ctx: AllocationContext` (the selected examples' token lengths and the shape
of an optimizer step), which the pipeline always passes; one that deals by count ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from repro.core.errors import UserError
from repro.core.types import Pool, Schedule, Selection

if TYPE_CHECKING:
    from repro.core.config.schema import ExperimentConfig


class SelectionError(UserError, ValueError):
    """A selection cannot be made as asked (budget larger than the pool, pool too small, ...)."""


@dataclass
class SelectionContext:
    """What a selector may use beyond the pool: the config, a seed, where to write features.

    `model_dir` is the local directory of the target model (for selectors that need the model:
    features, losses, gradients). `workdir` is the run directory; a selector that computes
    features writes `workdir / "features.npy"`.
    """

    config: ExperimentConfig
    seed: int
    world_size: int
    workdir: Path
    model_dir: Path | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class AllocationContext:
    """What an allocator may use beyond the selection: each selected id's token count
    (repro/core/steps.py token_lengths) and the shape of an optimizer step."""

    lengths: dict[str, int]
    per_device_batch: int
    grad_accum: int
    drop_last: bool = True


@runtime_checkable
class Selector(Protocol):
    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        """Return the kept ids. `budget` is a count (None: the method decides, e.g. CluSTER's ratio)."""
        ...


@runtime_checkable
class Allocator(Protocol):
    def allocate(
        self,
        selection: Selection,
        world_size: int,
        seed: int,
        epochs: int = 1,
        weight_mode: str = "none",
        ctx: AllocationContext | None = None,
    ) -> Schedule:
        """Deal the selected ids to `world_size` workers for each epoch, with loss weights."""
        ...


def resolve_budget(fraction: float | None, n: int | None, n_pool: int) -> int | None:
    """The kept count from the config: n wins, else round(fraction * n_pool); None if neither."""
    if n_pool <= 0:
        raise SelectionError("the pool is empty: nothing to select from")
    if n is not None:
        if n > n_pool:
            raise SelectionError(
                f"selection.n = {n} is larger than the pool ({n_pool} examples); "
                f"use at most {n_pool} or a fraction"
            )
        return n
    if fraction is not None:
        return max(1, round(fraction * n_pool))
    return None
