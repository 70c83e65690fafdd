"""`perplexity`: prune by the target model's perplexity of the WHOLE example text.

Perplexity pruning (Marion et al. 2023; Ankner et al. 2024) scores a document by a reference
model's perplexity over all its tokens, instruction included, unlike `loss`, which scores only the
response. Here the reference is the initial target model: exp(mean cross-entropy over every token
after the first). `keep: top` (default) keeps the highest perplexity; `middle` the band around the
median (the variant those papers found best for pretraining data); `bottom` the lowest.
"""

from __future__ import annotations

import numpy as np

from baselines.common import KEEP_MODES, check_budget, check_choice, model_scores, scored_selection, top_rows
from repro.core.interfaces import SelectionContext
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


@register_selector("perplexity")
class PerplexitySelector:
    """Keep `budget` examples by whole-text perplexity under the target model (top/middle/bottom)."""

    def __init__(self, keep: str = "top", batch_size: int = 8) -> None:
        check_choice(keep, KEEP_MODES, "keep")
        self.keep, self.batch_size = keep, int(batch_size)

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        budget = check_budget("perplexity", pool, budget)
        stats = model_scores("perplexity", pool, ctx, "all", self.batch_size)
        ppl = np.exp(np.minimum(stats["loss"], 50.0))
        rows = top_rows(ppl, budget, self.keep)
        return scored_selection("perplexity", pool, rows, ppl, {"keep": self.keep})
