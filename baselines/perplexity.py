"""`perplexity`: prune by the target model's perplexity of the WHOLE example text.

Perplexity pruning (Marion et al. 2023; Ankner et al. 2024) scores a document by a reference
model's perplexity over all its tokens, instruction included, unlike `loss`, which scores only the
response. Here the reference is the initial target model: exp(mean cross-entropy over every token
after the first). `keep: top` (default) keeps the highest perplexity; `middle` the band around the
median (the variant those papers found best for pretraining data); `bottom` the lowest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from baselines.common import KEEP_MODES, check_budget, model_scores, scored_selection, top_rows
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


@register_selector("perplexity")
class PerplexitySelector(Parameterized):
    """Keep `budget` examples by whole-text perplexity under the target model (top/middle/bottom)."""

    # match_compute_of's planned own selection cost, in forward passes over the pool
    # (repro/experiments/compute.py): one forward pass of the target model per example.
    planned_selection_passes = 1.0

    @dataclass
    class Params:
        keep: Literal[KEEP_MODES] = param("top", help="which scores to keep: top, bottom, middle")  # type: ignore[valid-type]
        batch_size: int = param(8, lo=1, help="examples per forward pass")

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        budget = check_budget("perplexity", pool, budget)
        stats = model_scores("perplexity", pool, ctx, "all", self.batch_size)
        ppl = np.exp(np.minimum(stats["loss"], 50.0))
        rows = top_rows(ppl, budget, self.keep)
        return scored_selection("perplexity", pool, rows, ppl, {"keep": self.keep})
