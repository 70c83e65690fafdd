"""Minimal evaluation: held-out loss and perplexity, and the demo pool's checkable tasks.

The eight paper benchmarks run through lm-evaluation-harness in `evals/`; this module only scores
what every run can score without any benchmark data.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from repro.types import Pool


def _stderr_mean(values: list[float]) -> float | None:
    n = len(values)
    if n < 2:
        return None
    mu = sum(values) / n
    var = sum((v - mu) ** 2 for v in values) / (n - 1)
    return math.sqrt(var / n)


@torch.no_grad()
def heldout_loss(model: Any, tokenizer: Any, pool: Pool, max_length: int, batch_size: int,
                 device: str = "cpu") -> dict[str, Any]:
    """Token-weighted mean next-token loss on response tokens (nats) and its perplexity."""
    from repro.data import TokenizedPool, collate

    tok = TokenizedPool(pool, tokenizer, max_length, on_bad_row="skip")
    ids = [e.id for e in pool.examples if e.id in tok]
    total_loss, total_tokens, per_example = 0.0, 0, []
    model.eval()
    for start in range(0, len(ids), batch_size):
        batch = collate([tok[i] for i in ids[start:start + batch_size]], tokenizer.pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits, targets = logits[:, :-1].float(), batch["labels"][:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100,
            reduction="none").view(targets.shape)
        mask = targets != -100
        sums, counts = (losses * mask).sum(1), mask.sum(1)
        total_loss += float(sums.sum())
        total_tokens += int(counts.sum())
        per_example += (sums / counts.clamp(min=1)).tolist()
    loss = total_loss / max(1, total_tokens)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "n": len(ids),
            "tokens": total_tokens, "loss_stderr": _stderr_mean(per_example),
            "skipped": dict(tok.skipped)}


@torch.no_grad()
def generate(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int, batch_size: int,
             device: str = "cpu") -> list[str]:
    """Greedy continuations of `prompts` (left-padded batches), decoded without special tokens."""
    out: list[str] = []
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        for start in range(0, len(prompts), batch_size):
            enc = tokenizer(prompts[start:start + batch_size], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(device)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            out += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = old_side
    return out


def demo_task_scores(model: Any, tokenizer: Any, pool: Pool, max_new_tokens: int, batch_size: int,
                     device: str = "cpu", limit: int | None = None
                     ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Generate for the demo's held-out items and score them (exact match or execution).

    Returns ({category: {"value", "stderr", "n"}} plus "overall", per-sample log rows).
    """
    from repro.demo_pool import score_generation

    items = [e for e in pool.examples if e.meta.get("check")]
    if limit is not None:
        items = items[:limit]
    model.eval()
    gens = generate(model, tokenizer, [e.prompt for e in items], max_new_tokens, batch_size, device)
    by_cat: dict[str, list[float]] = defaultdict(list)
    samples = []
    for ex, g in zip(items, gens):
        s = score_generation(ex.meta, g)
        by_cat[ex.category or "none"].append(s)
        samples.append({"id": ex.id, "category": ex.category, "generation": g,
                        "answer": ex.meta.get("answer"), "score": s})
    scores: dict[str, dict[str, Any]] = {}
    for cat, vals in sorted(by_cat.items()):
        scores[cat] = _binary_summary(vals)
    scores["overall"] = _binary_summary([v for vals in by_cat.values() for v in vals])
    return scores, samples


def _binary_summary(vals: list[float]) -> dict[str, Any]:
    n = len(vals)
    p = sum(vals) / n if n else float("nan")
    return {"value": p, "stderr": math.sqrt(p * (1 - p) / n) if n > 1 else None, "n": n}
