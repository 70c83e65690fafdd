"""`loss`: prune by the target model's per-example error, keeping the top of the budget.

Score (from the initial target model, one forward pass, `baselines.common.forward_stats`):
`score: loss` (default) the mean response-token cross-entropy; `score: el2n` the mean L2 norm of
(softmax - one-hot) over response tokens, EL2N (Paul et al. 2021) with the target model standing in
for an early-training checkpoint. `keep: top` keeps the hardest examples (the pruning literature's
default for large budgets); `bottom` the easiest; `middle` those around the median.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from baselines.common import KEEP_MODES, check_budget, model_scores, scored_selection, top_rows
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


@register_selector("loss")
class LossSelector(Parameterized):
    """Keep the `budget` examples with the highest target-model loss (or EL2N)."""

    # match_compute_of's planned own selection cost, in forward passes over the pool
    # (repro/experiments/compute.py): one forward pass of the target model per example.
    planned_selection_passes = 1.0

    @dataclass
    class Params:
        score: Literal["loss", "el2n"] = param("loss", help="the response's mean loss, or EL2N")
        keep: Literal[KEEP_MODES] = param("top", help="which scores to keep: top, bottom, middle")  # type: ignore[valid-type]
        batch_size: int = param(8, lo=1, help="examples per forward pass")

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        budget = check_budget("loss", pool, budget)
        scores = model_scores("loss", pool, ctx, "response", self.batch_size)[self.score]
        rows = top_rows(scores, budget, self.keep)
        return scored_selection("loss", pool, rows, scores, {"score": self.score, "keep": self.keep})
