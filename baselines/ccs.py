"""`ccs`: Coverage-centric coreset selection (Zheng et al. 2023), on a target-model score.

1. Score every example (`score: el2n` by default, or `loss`; `baselines.common.forward_stats`).
2. Drop the hardest `hard_cutoff` fraction (highest scores: likely mislabeled or noisy).
3. Split the remaining score range into `n_strata` equal-width strata.
4. Spread the budget evenly over the strata, smallest first (a stratum with fewer examples than
   its share gives the rest to the larger ones), drawing at random (seeded) inside each.
So every score level is covered, unlike top-k pruning, which keeps only the hard end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from baselines.common import (
    check_budget,
    check_pool_size,
    model_scores,
    scored_selection,
    spread_over_groups,
)
from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


def strata_of(scores: np.ndarray, n_strata: int) -> np.ndarray:
    """Stratum index 0..n_strata-1 of each score: equal-width bins over [min, max]."""
    lo, hi = float(scores.min()), float(scores.max())
    if hi <= lo:
        return np.zeros(scores.size, dtype=np.int64)
    return np.minimum(((scores - lo) / (hi - lo) * n_strata).astype(np.int64), n_strata - 1)


@register_selector("ccs")
class CCSSelector(Parameterized):
    """Coverage-centric selection: drop the hardest fraction, spread the budget over score strata.

    score: el2n (default) or loss. hard_cutoff: fraction of the hardest examples dropped (0.1).
    n_strata: equal-width score strata (50).
    """

    # match_compute_of's planned own selection cost, in forward passes over the pool
    # (repro/experiments/compute.py): one scoring forward pass per example.
    planned_selection_passes = 1.0

    @dataclass
    class Params:
        score: Literal["el2n", "loss"] = param("el2n", help="the difficulty score stratified over")
        hard_cutoff: float = param(
            0.1, lo=0, hi=1, hi_incl=False, note="a fraction", help="share of the hardest examples left out"
        )
        n_strata: int = param(50, lo=1, help="score strata the budget is spread over")
        batch_size: int = param(8, lo=1, help="examples per forward pass")

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        budget = check_budget("ccs", pool, budget)
        check_pool_size("ccs", pool, self.n_strata, "selection.params.n_strata")
        scores = model_scores("ccs", pool, ctx, "response", self.batch_size)[self.score]
        n_drop = math.floor(self.hard_cutoff * len(pool))
        hardest = np.argsort(-scores, kind="stable")[:n_drop]
        rest = np.setdiff1d(np.arange(len(pool)), hardest)
        if budget > rest.size:
            raise SelectionError(
                f"selector 'ccs': budget {budget} is larger than the "
                f"{rest.size} examples left after dropping the hardest "
                f"{self.hard_cutoff:.0%}; lower selection.params.hard_cutoff "
                "or the budget"
            )
        strata = strata_of(scores[rest], self.n_strata)
        groups = [rest[strata == s] for s in range(self.n_strata)]
        chosen = spread_over_groups(groups, budget, np.random.default_rng([ctx.seed, 31]))
        rows = np.sort(np.concatenate(chosen))
        return scored_selection(
            "ccs",
            pool,
            rows,
            scores,
            {
                "score": self.score,
                "hard_cutoff": self.hard_cutoff,
                "n_dropped_hardest": n_drop,
                "n_strata": self.n_strata,
                "stratum_sizes": [int(g.size) for g in groups],
                "stratum_kept": [int(c.size) for c in chosen],
            },
        )
