"""`grand`: prune by the per-example gradient norm (GraNd, Paul et al. 2021), LoRA gradients.

For each example, the L2 norm of the gradient of its own mean response-token loss with respect to
the LoRA weights of the target model (exact per-example gradients from one batched backward,
`method.lora_grads.PerExampleLoraGrads`; no projection, so the norm is exact). GraNd averages
the norm over several initializations: `n_inits` fresh LoRA draws (seeded by run seed + i).
A fresh LoRA has B = 0, so the norm is that of the B gradient. Keeps the largest norms
(`keep: top`), or `bottom` / `middle`. LoRA settings come from model.lora (its defaults if off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from baselines.common import (
    KEEP_MODES,
    check_budget,
    scored_selection,
    scoring_model,
    tokenize_pool,
    top_rows,
)
from repro.core.interfaces import SelectionContext
from repro.core.log import progress_bar
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


def lora_gradient_norms(model, items: list[dict], pad_token_id: int, batch_size: int) -> np.ndarray:
    """[N] L2 norms of each example's LoRA gradient (batched by length)."""
    from method.lora_grads import PerExampleLoraGrads
    from repro.core.tokens import collate

    out = np.zeros(len(items))
    order = sorted(range(len(items)), key=lambda i: -len(items[i]["input_ids"]))
    bar = progress_bar(total=len(items), desc="grand gradients", unit="ex")
    with PerExampleLoraGrads(model) as hooks:
        for s in range(0, len(items), batch_size):
            idx = order[s : s + batch_size]
            g = hooks.flat(collate([items[i] for i in idx], pad_token_id))
            out[idx] = g.norm(dim=1).double().cpu().numpy()
            bar.update(len(idx))
    bar.close()
    return out


@register_selector("grand")
class GrandSelector(Parameterized):
    """Keep the `budget` examples with the largest per-example LoRA gradient norm."""

    # match_compute_of's planned own selection cost, in forward passes over the pool
    # (repro/experiments/compute.py): a forward and a backward pass per example (about 3 forward passes).
    planned_selection_passes = 3.0

    @dataclass
    class Params:
        n_inits: int = param(1, lo=1, help="LoRA initializations the gradient norms are averaged over")
        keep: Literal[KEEP_MODES] = param("top", help="which scores to keep: top, bottom, middle")  # type: ignore[valid-type]
        batch_size: int = param(8, lo=1, help="examples per forward pass")

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        budget = check_budget("grand", pool, budget)
        norms = np.zeros(len(pool))
        for i in range(self.n_inits):
            model, tok = scoring_model(ctx, "grand", lora=True, seed=ctx.seed + i)
            items = tokenize_pool(pool, tok, ctx.config.data.max_length)
            norms += lora_gradient_norms(model, items, tok.pad_token_id, self.batch_size)
        norms /= self.n_inits
        rows = top_rows(norms, budget, self.keep)
        return scored_selection("grand", pool, rows, norms, {"n_inits": self.n_inits, "keep": self.keep})
