"""`ifd`: Instruction-Following Difficulty (Cherry LLM, Li et al. 2023).

IFD = loss(response | instruction) / loss(response alone), both the mean cross-entropy of the
same response tokens under the initial target model (two forward passes of
`baselines.common.forward_stats`). A low IFD means the instruction explains the response; IFD >= 1
means the instruction does not help at all (often a mismatched pair), so those are left out. The
selector keeps the highest IFD below 1 (the hardest examples that are still coherent); if fewer
than the budget are below 1, the rest come from IFD >= 1, closest to 1 first, and the summary says
how many. When the tokenizer adds no leading token (e.g. BOS), the response's first token cannot be
predicted without the instruction, so it is left out of both losses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from baselines.common import (
    check_budget,
    forward_stats,
    response_alone,
    scored_selection,
    scoring_model,
    tokenize_pool,
)
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


def leading_special_tokens(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before any text by default (e.g. [BOS], or [])."""
    with_sp = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    for start in range(len(with_sp) - len(plain) + 1):
        if with_sp[start : start + len(plain)] == plain:
            return list(with_sp[:start])
    return []


def ifd_scores(model, tokenizer, items: list[dict], batch_size: int) -> dict[str, np.ndarray]:
    """{"ifd", "loss_conditioned", "loss_alone"} per item (NaN where no response token scores)."""
    leading = leading_special_tokens(tokenizer)
    cond_items = []
    for it in items:
        labels = list(it["labels"])
        if not leading:  # the response's first token: unpredictable alone, so scored in neither
            p = sum(1 for x in labels if x == -100)
            labels[p] = -100
        cond_items.append({**it, "labels": labels})
    alone_items = [response_alone(it, leading) for it in cond_items]
    pad = tokenizer.pad_token_id
    cond = forward_stats(model, cond_items, pad, batch_size, "ifd: response | instruction")
    alone = forward_stats(model, alone_items, pad, batch_size, "ifd: response alone")
    ok = (cond["tokens"] > 0) & (alone["loss"] > 0)
    ifd = np.full(len(items), np.nan)
    ifd[ok] = cond["loss"][ok] / alone["loss"][ok]
    return {"ifd": ifd, "loss_conditioned": cond["loss"], "loss_alone": alone["loss"]}


def ifd_order(ifd: np.ndarray) -> np.ndarray:
    """Rows in keeping order: IFD < 1 from highest to lowest, then IFD >= 1 from lowest up,
    then rows without a score; ties by row index."""
    group = np.where(np.isnan(ifd), 2, np.where(ifd < 1, 0, 1))
    key = np.where(group == 0, -ifd, np.where(group == 1, ifd, 0.0))
    return np.lexsort((np.arange(ifd.size), key, group))


@register_selector("ifd")
class IFDSelector(Parameterized):
    """Keep the `budget` examples with the highest Instruction-Following Difficulty below 1."""

    # match_compute_of's planned own selection cost, in forward passes over the pool
    # (repro/experiments/compute.py): two forward passes of the target model per example.
    planned_selection_passes = 2.0

    @dataclass
    class Params:
        batch_size: int = param(8, lo=1, help="examples per forward pass")

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        budget = check_budget("ifd", pool, budget)
        model, tok = scoring_model(ctx, "ifd")
        s = ifd_scores(model, tok, tokenize_pool(pool, tok, ctx.config.data.max_length), self.batch_size)
        ifd = s["ifd"]
        rows = np.sort(ifd_order(ifd)[:budget])
        below = int(np.sum(ifd < 1))
        return scored_selection(
            "ifd",
            pool,
            rows,
            ifd,
            {
                "n_ifd_below_1": below,
                "n_kept_ifd_at_least_1": int(np.sum(~(ifd[rows] < 1))),
                "n_unscored": int(np.isnan(ifd).sum()),
            },
        )
