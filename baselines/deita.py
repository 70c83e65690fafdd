"""`deita-ifd` and `deita-perplexity`: deita's score-first diversity filter (Liu et al. 2024,
"What Makes Good Data for Alignment?"), with the score taken from the target model.

1. Score every example and sort, best first. deita's own scorers (its complexity and quality
   LLaMA scorers) are not available offline, so the score comes from the initial target model,
   and the selector's name says which: `deita-ifd` orders by IFD as the `ifd` baseline does
   (highest IFD below 1 first, then IFD >= 1 from 1 up); `deita-perplexity` by the response's
   perplexity under the model, highest first (the hardest responses, a complexity proxy).
2. Embed every example: the target model's mean-pooled final hidden states, centered and
   L2-normalized (deita embeds with the model being trained too).
3. Go down the sorted list; add an example only if its cosine distance to its nearest
   already-selected example exceeds `threshold` (deita's Repr Filter, 0.1 = similarity 0.9),
   until the budget. If the list runs out first, the rest of the budget is filled with the
   best-scored examples the filter passed over, in score order (`info.n_refilled`), so the count
   is always the budget.

The result rows name the method by the registered name (`deita-ifd`, `deita-perplexity`), so
nobody mistakes them for deita's own scorers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from baselines.common import (
    check_budget,
    forward_stats,
    hidden_state_embeddings,
    scored_selection,
    scoring_model,
    tokenize_pool,
    unit_rows,
)
from baselines.ifd import ifd_order, ifd_scores
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


def diversity_filter(
    order: np.ndarray, E: np.ndarray, budget: int, threshold: float
) -> tuple[np.ndarray, int]:
    """(kept rows in the order taken, how many were refilled). E rows are unit vectors; a row is
    taken when 1 - its largest cosine to the rows taken so far exceeds `threshold`."""
    kept: list[int] = []
    passed: list[int] = []
    nearest = np.full(E.shape[0], -np.inf)  # largest cosine to any kept row, per row
    for i in order.tolist():
        if len(kept) == budget:
            break
        if kept and 1.0 - nearest[i] <= threshold:
            passed.append(i)
            continue
        kept.append(i)
        nearest = np.maximum(nearest, E @ E[i])
    refill = passed[: budget - len(kept)]
    return np.array(kept + refill, dtype=np.int64), len(refill)


class _Deita(Parameterized):
    """The shared selector; the registered subclasses fix the score."""

    score = ""

    @dataclass
    class Params:
        threshold: float = param(
            0.1,
            lo=0,
            hi=2,
            hi_incl=False,
            note="a cosine distance; deita's default 0.1 = similarity 0.9",
            help="an example is taken when its distance to every kept one exceeds this",
        )
        batch_size: int = param(8, lo=1, help="examples per forward pass")

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        name = f"deita-{self.score}"
        budget = check_budget(name, pool, budget)
        model, tok = scoring_model(ctx, name)
        items = tokenize_pool(pool, tok, ctx.config.data.max_length)
        if self.score == "ifd":
            scores = ifd_scores(model, tok, items, self.batch_size)["ifd"]
            order = ifd_order(scores)
        else:
            loss = forward_stats(model, items, tok.pad_token_id, self.batch_size, f"{name} scores")["loss"]
            scores = np.exp(np.minimum(loss, 50.0))
            order = np.argsort(-scores, kind="stable")
        E = unit_rows(
            hidden_state_embeddings(
                model, items, tok.pad_token_id, self.batch_size, desc=f"{name} embeddings"
            ),
            center=True,
        )
        rows, refilled = diversity_filter(order, E, budget, self.threshold)
        return scored_selection(
            name,
            pool,
            np.sort(rows),
            scores,
            {
                "score": self.score,
                "threshold": self.threshold,
                "n_refilled": refilled,
                "scorer": "the initial target model (deita's own scorers are not available offline)",
            },
        )


@register_selector("deita-ifd")
class DeitaIFDSelector(_Deita):
    """deita's diversity filter over examples sorted by IFD under the target model."""

    score = "ifd"


@register_selector("deita-perplexity")
class DeitaPerplexitySelector(_Deita):
    """deita's diversity filter over examples sorted by response perplexity, highest first."""

    score = "perplexity"
