"""What every run can score on its own held-out rows, without benchmark data: the held-out loss
and perplexity (per category where the rows have one), and greedy generation for the benchmarks
that score a data source's held-out rows (evals/plugins.py; the demo's: repro/demo/tasks.py).

The eight paper benchmarks run through lm-evaluation-harness in `evals/`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from repro.core.types import Pool


def _stderr_mean(values: list[float]) -> float | None:
    n = len(values)
    if n < 2:
        return None
    mu = sum(values) / n
    var = sum((v - mu) ** 2 for v in values) / (n - 1)
    return math.sqrt(var / n)


@torch.no_grad()
def heldout_loss(
    model: Any, tokenizer: Any, pool: Pool, max_length: int, batch_size: int, device: str = "cpu"
) -> dict[str, Any]:
    """Token-weighted mean next-token loss on response tokens (nats) and its perplexity.

    Where the examples have categories (the demo's, a user's `category` field), "by_category"
    holds the same numbers per category ({category: {"loss", "perplexity", "n", "tokens",
    "loss_stderr"}}, sorted by name), so a selection that starves a rare category shows there
    even when the pooled loss hides it.
    """
    from repro.core.tokens import TokenizedPool, collate

    tok = TokenizedPool(pool, tokenizer, max_length, on_bad_row="skip")
    ids = [e.id for e in pool.examples if e.id in tok]
    cat_of = {e.id: e.category for e in pool.examples}
    total_loss, total_tokens, per_example = 0.0, 0, []
    sums_of: list[float] = []  # per example: summed loss and response tokens (for categories)
    tokens_of: list[int] = []
    model.eval()
    for start in range(0, len(ids), batch_size):
        batch = collate([tok[i] for i in ids[start : start + batch_size]], tokenizer.pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits, targets = logits[:, :-1].float(), batch["labels"][:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100, reduction="none"
        ).view(targets.shape)
        mask = targets != -100
        sums, counts = (losses * mask).sum(1), mask.sum(1)
        total_loss += float(sums.sum())
        total_tokens += int(counts.sum())
        per_example += (sums / counts.clamp(min=1)).tolist()
        sums_of += sums.tolist()
        tokens_of += counts.tolist()
    out = {**_loss_summary(total_loss, total_tokens, per_example), "skipped": dict(tok.skipped)}
    by_cat: dict[str, list[int]] = defaultdict(list)  # category -> positions in ids
    for k, i in enumerate(ids):
        if cat_of[i]:
            by_cat[cat_of[i]].append(k)
    if by_cat:
        out["by_category"] = {
            c: _loss_summary(
                sum(sums_of[k] for k in ks), sum(tokens_of[k] for k in ks), [per_example[k] for k in ks]
            )
            for c, ks in sorted(by_cat.items())
        }
    return out


def _loss_summary(loss_sum: float, tokens: int, per_example: list[float]) -> dict[str, Any]:
    """Token-weighted mean loss, its perplexity, examples, tokens, and the stderr over examples."""
    loss = loss_sum / max(1, tokens)
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "n": len(per_example),
        "tokens": tokens,
        "loss_stderr": _stderr_mean(per_example),
    }


class FirstLineDone:
    """A per-sequence stopping rule for `model.generate`: a sequence is done once its new text has
    a non-empty line followed by a newline. Exact-match scoring reads only that first line, so
    stopping there changes no score and saves most of the decoding steps of short answers."""

    def __init__(self, tokenizer: Any, prompt_len: int):
        self.tokenizer, self.prompt_len = tokenizer, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_len :], skip_special_tokens=True)
        done = ["\n" in t.lstrip() for t in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int,
    device: str = "cpu",
    first_line_only: bool = False,
) -> list[str]:
    """Greedy continuations of `prompts` (left-padded batches), decoded without special tokens.

    first_line_only: stop each sequence at the end of its first non-empty line (see FirstLineDone).
    """
    from transformers import StoppingCriteriaList

    out: list[str] = []
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        for start in range(0, len(prompts), batch_size):
            enc = tokenizer(
                prompts[start : start + batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            ).to(device)
            stop = (
                StoppingCriteriaList([FirstLineDone(tokenizer, enc["input_ids"].shape[1])])
                if first_line_only
                else None
            )
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                stopping_criteria=stop,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            out += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = old_side
    return out
