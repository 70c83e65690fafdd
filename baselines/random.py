"""`random`: a seeded uniform sample without replacement, of a given size or fraction."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


@register_selector("random")
class RandomSelector(Parameterized):
    """Uniform sample of `budget` ids (selection.n or selection.fraction), seeded by the run seed.

    `seed_offset` lets several random draws at one run seed differ (e.g. for variance estimates).
    The kept ids stay in pool order; the allocator shuffles.
    """

    # match_compute_of's planned own selection cost, in forward passes over the pool
    # (repro/experiments/compute.py): no model: a seeded draw.
    planned_selection_passes = 0.0

    meets_budget = True  # exactly the budget (repro/contracts.py checks it)

    @dataclass
    class Params:
        seed_offset: int = param(
            0, lo=0, hi=2**32 - 1, help="added to the run seed, so draws at one run seed can differ"
        )

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        if budget is None:
            raise SelectionError(
                "selector 'random' needs a budget: set selection.n (a count) or "
                "selection.fraction (0 < f <= 1)"
            )
        if budget > len(pool):
            raise SelectionError(
                f"selector 'random': budget {budget} is larger than the pool ({len(pool)} examples)"
            )
        rng = np.random.default_rng(ctx.seed + self.seed_offset)
        keep = np.sort(rng.choice(len(pool), size=budget, replace=False))
        ids = pool.ids
        return Selection(
            ids=[ids[i] for i in keep], info={"method": "random", "seed": ctx.seed + self.seed_offset}
        )
