"""`grand`: prune by the per-example gradient norm (GraNd, Paul et al. 2021), LoRA gradients.

For each example, the L2 norm of the gradient of its own mean response-token loss with respect to
the LoRA weights of the target model (exact per-example gradients from one batched backward,
`method.lora_grads.PerExampleLoraGrads`; no projection, so the norm is exact). GraNd averages
the norm over several initializations: `n_inits` fresh LoRA draws (seeded by run seed + i).
A fresh LoRA has B = 0, so the norm is that of the B gradient. Keeps the largest norms
(`keep: top`), or `bottom` / `middle`. LoRA settings come from model.lora (its defaults if off).
"""

from __future__ import annotations

import numpy as np

from baselines.common import (
    KEEP_MODES,
    check_budget,
    check_choice,
    scored_selection,
    scoring_model,
    tokenize_pool,
    top_rows,
)
from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.log import progress_bar
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


def lora_gradient_norms(model, items: list[dict], pad_token_id: int, batch_size: int) -> np.ndarray:
    """[N] L2 norms of each example's LoRA gradient (batched by length)."""
    from method.lora_grads import PerExampleLoraGrads
    from repro.core.data import collate

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
class GrandSelector:
    """Keep the `budget` examples with the largest per-example LoRA gradient norm."""

    def __init__(self, n_inits: int = 1, keep: str = "top", batch_size: int = 8) -> None:
        check_choice(keep, KEEP_MODES, "keep")
        if n_inits < 1:
            raise SelectionError(f"selection.params.n_inits: expected >= 1, got {n_inits}")
        self.n_inits, self.keep, self.batch_size = int(n_inits), keep, int(batch_size)

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
