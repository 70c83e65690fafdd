"""`less`: LESS (Xia et al. 2024): select the examples whose gradients point where a small
validation set's gradient points.

1. Warm-up: LoRA on the target model, trained with AdamW for `epochs` epochs on a random
   `warmup_fraction` of the pool (at least `warmup_min` examples), constant lr (`lr`, default
   train.lr); a checkpoint after each epoch.
2. At each checkpoint: every pool example's per-example LoRA gradient, Adam-preconditioned with
   that checkpoint's optimizer moments (`method.lora_grads.adam_preconditioner`), and every
   validation example's plain (SGD) LoRA gradient, both projected to `proj_dim` dims by the same
   seeded Rademacher matrix (`method.lora_grads.lora_gradient_features`).
3. Score = sum over checkpoints of lr x the mean cosine similarity of the example's feature to the
   validation examples' gradients. Keep the top `budget`.

The validation set should come from the target benchmarks' domain: `validation: heldout` (the
run's held-out examples, heldout.jsonl in the run directory: the same data source, never trained
on), a benchmark's name (its dev split, e.g. mmlu_medical), or a data file relative to data_dir
with its `validation_format` (e.g. medagents/pubmedqa/train.jsonl with format pubmedqa), at most
`validation_n` examples (seeded sample; `baselines.common.target_examples`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from baselines.common import (
    check_budget,
    check_pool_size,
    scored_selection,
    scoring_model,
    target_examples,
    tokenize_pool,
    top_rows,
    train_briefly,
    unit_rows,
)
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


@register_selector("less")
class LessSelector(Parameterized):
    """Keep the examples whose Adam-preconditioned LoRA gradients best match a validation set's.

    warmup_fraction (0.05), warmup_min (16), epochs (4), lr (null: train.lr), proj_dim (8192),
    validation (heldout, or a data file), validation_format (auto), validation_n (64).
    """

    @dataclass
    class Params:
        warmup_fraction: float = param(
            0.05, lo=0, hi=1, lo_incl=False, note="a fraction", help="share of the pool in the warm-up"
        )
        warmup_min: int = param(16, lo=1, help="warm-up examples at least")
        epochs: int = param(4, lo=1, help="warm-up epochs (a checkpoint after each)")
        lr: float | None = param(
            None, lo=0, lo_incl=False, note="null: train.lr", help="warm-up learning rate"
        )
        proj_dim: int = param(8192, lo=1, help="the gradients' random projection's dimension")
        batch_size: int = param(8, lo=1, help="examples per batch")
        validation: str = param("heldout", help="the target set: heldout, a benchmark name, or a data file")
        validation_format: str = param("auto", help="the target file's format")
        validation_n: int = param(64, lo=1, help="target examples at most")

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        from method.lora_grads import adam_preconditioner, lora_gradient_features

        budget = check_budget("less", pool, budget)
        n_warm = max(self.warmup_min, round(self.warmup_fraction * len(pool)))
        check_pool_size(
            "less", pool, n_warm, "the warm-up size (selection.params.warmup_min, warmup_fraction)"
        )
        val = target_examples(
            "less",
            "selection.params.validation",
            ctx,
            self.validation,
            self.validation_format,
            self.validation_n,
        )
        model, tok = scoring_model(ctx, "less", lora=True)
        L = ctx.config.data.max_length
        items = tokenize_pool(pool, tok, L)
        val_items = tokenize_pool(val, tok, L)
        warm = np.sort(np.random.default_rng([ctx.seed, 41]).choice(len(pool), n_warm, replace=False))
        lr = float(self.lr if self.lr is not None else ctx.config.train.lr)
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        scores = np.zeros(len(pool))
        per_checkpoint: list[dict] = []

        def at_checkpoint(step: int, opt) -> None:
            pre = adam_preconditioner(opt.state_dict(), names)
            args = (tok.pad_token_id, self.batch_size, self.proj_dim, ctx.seed)
            X = unit_rows(lora_gradient_features(model, items, *args, preconditioner=pre))
            V = unit_rows(lora_gradient_features(model, val_items, *args))
            s = (X @ V.T).mean(axis=1)
            scores[:] += lr * s
            per_checkpoint.append({"step": step, "weight": lr, "mean_cosine": float(s.mean())})

        train_briefly(
            model,
            [items[i] for i in warm],
            tok.pad_token_id,
            self.epochs,
            lr,
            self.batch_size,
            ctx.seed,
            on_checkpoint=at_checkpoint,
            desc="less warm-up",
        )
        rows = top_rows(scores, budget, "top")
        return scored_selection(
            "less",
            pool,
            rows,
            scores,
            {
                "n_warmup": int(n_warm),
                "epochs": self.epochs,
                "lr": lr,
                "proj_dim": self.proj_dim,
                "validation": self.validation,
                "n_validation": len(val),
                "checkpoints": per_checkpoint,
            },
        )
