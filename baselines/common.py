"""What the baseline selectors share, written once.

- Budget checks with one wording for every selector (`check_budget`, `check_pool_size`).
- Turning scores into a kept set: `top_rows` (keep the top, bottom or middle of a ranking) and
  `spread_over_groups` (a budget spread evenly over groups, smallest first: CCS strata, S2L
  clusters), and `fill_to_budget` (deduplication: sample away the excess, refill a shortfall).
- The target model for scoring (`scoring_model`) and ONE forward helper, `forward_stats`, that gives
  every example's mean response-token loss, EL2N and token count in one pass (used by `loss`,
  `perplexity`, `ccs`, `ifd`); `response_alone` for IFD's unconditioned pass.
- `train_briefly`: the short single-process training loop of LESS's warm-up and S2L's proxy model.
- `hidden_state_embeddings`: the target model's final hidden states pooled per example (SemDeDup's
  `model` embeddings, RDS+, ClusterClip, deita's diversity filter), and `unit_rows`.
- `target_examples`: the examples a selector aims at (LESS's validation set, RDS+'s query sets):
  the run's held-out examples, a benchmark's dev split, or a data file.

Scores are per example in pool order; selections keep ids in pool order (the allocator shuffles).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.log import progress_bar
from repro.core.types import Pool, Selection

KEEP_MODES = ("top", "bottom", "middle")


# ----------------------------------------------------------------------------- budgets


def check_budget(method: str, pool: Pool, budget: int | None, optional: bool = False) -> int | None:
    """The budget as an int (None only if `optional`); SelectionError when missing or too large."""
    if budget is None:
        if optional:
            return None
        raise SelectionError(
            f"selector {method!r} needs a budget: set selection.n (a count) or "
            "selection.fraction (0 < f <= 1)"
        )
    if int(budget) != budget or budget < 1:
        raise SelectionError(f"selector {method!r}: budget must be a count >= 1, got {budget!r}")
    if budget > len(pool):
        raise SelectionError(
            f"selector {method!r}: budget {budget} is larger than the pool ({len(pool)} examples)"
        )
    return int(budget)


def check_pool_size(method: str, pool: Pool, need: int, why: str) -> None:
    """SelectionError when the pool has fewer than `need` examples (`why` names the parameter)."""
    if len(pool) < need:
        raise SelectionError(
            f"selector {method!r}: the pool has {len(pool)} examples, fewer than "
            f"{why} = {need}; use a larger pool or lower that parameter"
        )


def check_choice(value: Any, allowed: Sequence[str], key: str) -> None:
    if value not in allowed:
        raise SelectionError(f"selection.params.{key}: {value!r} is not one of {', '.join(allowed)}")


def need_model(method: str, ctx: SelectionContext) -> Path:
    if ctx.model_dir is None:
        raise SelectionError(
            f"selector {method!r} scores examples with the target model, but the "
            "selection context has no model_dir (run it through the pipeline)"
        )
    return Path(ctx.model_dir)


# ----------------------------------------------------------------------------- kept sets


def top_rows(scores: np.ndarray, budget: int, keep: str = "top") -> np.ndarray:
    """Row indices of `budget` examples by score: the highest ("top"), lowest ("bottom"), or those
    around the median ("middle"). Ties break by row index (stable), so the result is
    deterministic. Returned rows are sorted (pool order)."""
    check_choice(keep, KEEP_MODES, "keep")
    scores = np.asarray(scores, dtype=np.float64)
    if budget > scores.size:
        raise SelectionError(f"cannot keep {budget} of {scores.size} examples")
    if not np.isfinite(scores).all():
        bad = np.flatnonzero(~np.isfinite(scores))[:5].tolist()
        raise SelectionError(f"non-finite scores for rows {bad}: the model's outputs overflowed")
    if keep == "top":
        chosen = np.argsort(-scores, kind="stable")[:budget]
    else:
        asc = np.argsort(scores, kind="stable")
        start = 0 if keep == "bottom" else (asc.size - budget) // 2
        chosen = asc[start : start + budget]
    return np.sort(chosen)


def spread_over_groups(
    groups: Sequence[np.ndarray], budget: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Spread `budget` evenly over groups, smallest first: each group in turn (by size, ties by
    index) takes min(its size, remaining budget // groups left), members drawn at random. A small
    group's unused share passes to the larger ones, so the total is exactly `budget`
    (when the groups hold at least that many). Returns the chosen rows per group, sorted."""
    sizes = np.array([len(g) for g in groups])
    if budget > sizes.sum():
        raise SelectionError(
            f"cannot spread a budget of {budget} over groups holding {int(sizes.sum())} examples"
        )
    out: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(groups)
    remaining = budget
    order = np.argsort(sizes, kind="stable")
    for j, g in enumerate(order):
        take = min(int(sizes[g]), remaining // (len(order) - j))
        members = np.asarray(groups[g], dtype=np.int64)
        out[g] = np.sort(rng.choice(members, take, replace=False)) if take else members[:0]
        remaining -= take
    return out


def fill_to_budget(
    method: str, pool: Pool, kept: np.ndarray, budget: int | None, seed: int, info: dict[str, Any]
) -> Selection:
    """A deduplicator's selection: `kept` rows (the unique ones, pool order). More than the budget:
    a seeded random sample of them. Fewer: every unique row, topped up with randomly drawn
    duplicates so the count is right, and said in info["refilled_with_duplicates"]."""
    kept = np.sort(np.asarray(kept, dtype=np.int64))
    n_unique = int(kept.size)
    rng = np.random.default_rng([seed, 17])
    info = {
        "method": method,
        "n_pool": len(pool),
        "n_unique": n_unique,
        "n_duplicates": len(pool) - n_unique,
        **info,
    }
    if budget is None:
        rows = kept
    elif n_unique >= budget:
        rows = np.sort(rng.choice(kept, budget, replace=False))
        info["sampled_away"] = n_unique - budget
    else:
        dropped = np.setdiff1d(np.arange(len(pool)), kept)
        extra = rng.choice(dropped, budget - n_unique, replace=False)
        rows = np.sort(np.concatenate([kept, extra]))
        info["refilled_with_duplicates"] = int(budget - n_unique)
    ids = pool.ids
    return Selection(ids=[ids[i] for i in rows], info=info)


def scored_selection(
    method: str, pool: Pool, rows: np.ndarray, scores: np.ndarray, info: dict[str, Any]
) -> Selection:
    """Selection of `rows` (pool order) carrying their scores (None where not finite), with the
    mean score of the pool and of the kept rows in info."""
    ids = pool.ids
    s = np.asarray(scores, dtype=np.float64)
    fin = np.isfinite(s)

    def mean(mask: np.ndarray) -> float | None:
        return float(s[mask].mean()) if mask.any() else None

    kept = np.zeros(s.size, dtype=bool)
    kept[rows] = True
    info = {
        "method": method,
        "n_pool": len(pool),
        "kept": int(len(rows)),
        "score_mean_pool": mean(fin),
        "score_mean_kept": mean(fin & kept),
        **info,
    }
    return Selection(
        ids=[ids[i] for i in rows], scores=[float(s[i]) if fin[i] else None for i in rows], info=info
    )


# ----------------------------------------------------------------------------- the model


def scoring_model(
    ctx: SelectionContext,
    method: str,
    lora: bool = False,
    seed: int | None = None,
    model_dir: Path | None = None,
    model_cfg: Any = None,
):
    """(model, tokenizer) on CPU/GPU in eval mode: the INITIAL target model, without LoRA unless
    `lora` (then LoRA as configured, or the config's defaults if it is off; A drawn from `seed`)."""
    import torch

    from repro.core.models import load_model_and_tokenizer
    from repro.core.runtime import seed_everything

    mcfg = model_cfg or ctx.config.model
    lcfg = dataclasses.replace(mcfg.lora, enabled=lora)
    mcfg = dataclasses.replace(mcfg, lora=lcfg)
    seed_everything(ctx.seed if seed is None else seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok = load_model_and_tokenizer(model_dir or need_model(method, ctx), mcfg, device=device)
    model.eval()
    return model, tok


def tokenize_pool(
    pool: Pool, tokenizer: Any, max_length: int, labels: str = "response", cut_prompt: bool = False
) -> list[dict]:
    """`repro.core.data` tokenization of every example, in pool order. labels="all" puts every token
    after the first in the loss (perplexity of the whole text); "response" is the training loss.
    An example longer than max_length is cut from the right, as training does; one whose prompt
    leaves no response token is an error, unless `cut_prompt` (for a proxy model with another
    tokenizer, e.g. S2L's byte-level one): then the prompt keeps its last tokens and the response
    at least min(its length, max_length // 2) tokens."""
    from repro.core.tokens import TokenizedPool, tokenize_example

    if cut_prompt:
        items = []
        for e in pool.examples:
            it = tokenize_example(e, tokenizer, 1 << 30)
            p = sum(1 for x in it["labels"] if x == -100)
            r = len(it["input_ids"]) - p
            r_keep = min(r, max_length - min(p, max_length // 2))
            p_keep = min(p, max_length - r_keep)
            sl = slice(p - p_keep, p + r_keep)
            items.append(
                {"input_ids": it["input_ids"][sl], "labels": it["labels"][sl], "n_response_tokens": r_keep}
            )
    else:
        tp = TokenizedPool(pool, tokenizer, max_length, on_bad_row="error")
        items = [tp[i] for i in pool.ids]
    if labels == "all":
        items = [{**it, "labels": list(it["input_ids"])} for it in items]
    return items


def response_alone(item: dict, leading: list[int]) -> dict:
    """The same response tokens with the prompt replaced by the tokenizer's leading special tokens
    (`leading`, e.g. [BOS], or []): IFD's loss(response alone). Without a leading token the first
    response token cannot be predicted; `ifd` then masks it in both passes."""
    p = sum(1 for x in item["labels"] if x == -100)
    return {
        "input_ids": list(leading) + list(item["input_ids"][p:]),
        "labels": [-100] * len(leading) + list(item["labels"][p:]),
    }


def forward_stats(
    model: Any,
    items: list[dict],
    pad_token_id: int,
    batch_size: int = 8,
    desc: str = "scoring",
    chunk_rows: int = 2048,
) -> dict[str, np.ndarray]:
    """One no-grad forward pass over `items` (tokenized dicts): per example
      loss   mean next-token cross-entropy over its labelled tokens (nats/token),
      el2n   mean over those tokens of ||softmax(logits) - onehot(y)||_2 (EL2N, Paul et al. 2021),
      tokens the number of labelled (predicted) tokens.
    The LM head runs only at labelled positions, `chunk_rows` at a time
    (repro.core.lmhead.head_chunks), so memory is chunk_rows x vocab instead of batch x length x
    vocab (1.6 GB per batch of 8 x 1024 tokens for a 49k vocabulary). Batches are formed by
    length; results do not depend on them. The model runs in its own dtype (no autocast)."""
    import torch

    from repro.core.lmhead import head_chunks, labelled_positions
    from repro.core.tokens import collate

    n = len(items)
    loss, el2n, tokens = np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64)
    if n == 0:
        return {"loss": loss, "el2n": el2n, "tokens": tokens}
    dev = next(model.parameters()).device
    order = sorted(range(n), key=lambda i: -len(items[i]["input_ids"]))
    bar = progress_bar(total=n, desc=desc, unit="ex")
    with torch.no_grad():
        for s in range(0, n, batch_size):
            idx = order[s : s + batch_size]
            b = collate([items[i] for i in idx], pad_token_id)
            labels = b["labels"].to(dev)
            k = len(idx)
            nll = torch.zeros(k, device=dev, dtype=torch.float64)
            err = torch.zeros(k, device=dev, dtype=torch.float64)
            for rr, _, yy, z in head_chunks(
                model, b["input_ids"].to(dev), b["attention_mask"].to(dev), labels, chunk_rows, bf16=False
            ):
                logz = torch.logsumexp(z, dim=-1)
                logp = z.gather(1, yy[:, None])[:, 0] - logz
                sum_p2 = torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * logz)
                e = torch.sqrt((sum_p2 - 2 * logp.exp() + 1).clamp_min(0))
                nll.index_add_(0, rr, -logp.double())
                err.index_add_(0, rr, e.double())
            cnt = labelled_positions(labels)[1].sum(dim=1)
            c = cnt.clamp_min(1).double()
            loss[idx], el2n[idx] = (nll / c).cpu().numpy(), (err / c).cpu().numpy()
            tokens[idx] = cnt.cpu().numpy()
            bar.update(k)
    bar.close()
    return {"loss": loss, "el2n": el2n, "tokens": tokens}


def model_scores(
    method: str, pool: Pool, ctx: SelectionContext, labels: str = "response", batch_size: int = 8
) -> dict[str, np.ndarray]:
    """`forward_stats` of the initial target model (no LoRA) over the pool, in pool order."""
    model, tok = scoring_model(ctx, method)
    items = tokenize_pool(pool, tok, ctx.config.data.max_length, labels)
    return forward_stats(model, items, tok.pad_token_id, batch_size, desc=f"{method} scores")


POOLINGS = ("mean", "weighted")


def hidden_state_embeddings(
    model: Any,
    items: list[dict],
    pad_token_id: int,
    batch_size: int = 8,
    pooling: str = "mean",
    desc: str = "embeddings",
) -> np.ndarray:
    """N x H float32: each example's final hidden states (the LM head's input), pooled over its
    tokens: "mean" (every token alike) or "weighted" (token t of T weighted t / sum(1..T), the
    position-weighted mean of RDS+: later tokens have read more of the example). No grad."""
    import torch

    from repro.core.lmhead import core_model
    from repro.core.tokens import collate

    check_choice(pooling, POOLINGS, "pooling")
    dec = getattr(core_model(model), "model", None)  # the body without the LM head (Llama-style)
    dev = next(model.parameters()).device
    out = np.zeros((len(items), model.config.hidden_size), dtype=np.float32)
    bar = progress_bar(total=len(items), desc=desc, unit="ex")
    with torch.no_grad():
        for s in range(0, len(items), batch_size):
            b = collate(items[s : s + batch_size], pad_token_id)
            ids, mask = b["input_ids"].to(dev), b["attention_mask"].to(dev)
            if dec is not None:
                h = dec(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            else:
                h = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
            w = mask.float()
            if pooling == "weighted":
                w = w * torch.cumsum(w, dim=1)  # position 1..T of each example's own tokens
            w = w[..., None]
            out[s : s + len(ids)] = ((h.float() * w).sum(1) / w.sum(1)).cpu().numpy()
            bar.update(len(ids))
    bar.close()
    return out


def unit_rows(E: np.ndarray, center: bool = False) -> np.ndarray:
    """Rows scaled to unit L2 norm (cosine similarity becomes a dot product); `center` subtracts
    the mean row first (raw LM states share one large direction, which makes every pair look
    alike)."""
    E = np.asarray(E, dtype=np.float32)
    if center:
        E = E - E.mean(axis=0, keepdims=True)
    return E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12)


def target_examples(method: str, key: str, ctx: SelectionContext, source: str, fmt: str, n: int) -> Pool:
    """The examples a selector aims at, at most `n` (a seeded sample): `heldout` (the run's
    held-out examples, heldout.jsonl in the run directory: the same data source, never trained
    on), a benchmark's name (its dev split, `evals.dev_split`), or a data file relative to
    data_dir in format `fmt`. `key` names the parameter in messages."""
    from evals.dev_split import dev_examples, is_benchmark
    from repro.core.config.schema import DataSource
    from repro.core.data import load_pool
    from repro.core.io import read_jsonl
    from repro.core.types import Example

    if source == "heldout":
        path = Path(ctx.workdir) / "heldout.jsonl"
        if not path.is_file():
            raise SelectionError(
                f"selector {method!r}: {key} 'heldout' reads {path}, which does "
                "not exist; run through the pipeline (its pool stage writes it) "
                f"or set {key} to a benchmark or a data file"
            )
        found = Pool([Example.from_dict(r) for r in read_jsonl(path)], source)
    elif is_benchmark(source):
        try:
            found = Pool(dev_examples(source, ctx.config.resolved_data_dir()), source)
        except (OSError, ValueError) as e:  # missing local data, or no dev split
            raise SelectionError(f"selector {method!r}: {key} {source!r}: {e}") from e
    else:
        cfg = ctx.config
        data = dataclasses.replace(
            cfg.data, sources=[DataSource(path=source, format=fmt)], heldout_fraction=0.0
        )
        # Conversations get the chat template the training pool was rendered with.
        tok = None
        if ctx.model_dir:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(ctx.model_dir)
        found, _ = load_pool(dataclasses.replace(cfg, data=data), tok)
    if len(found) == 0:
        raise SelectionError(
            f"selector {method!r}: {key} {source!r} holds no examples (set "
            "data.heldout_fraction > 0 for 'heldout', or name a benchmark or a "
            "data file)"
        )
    if len(found) > n:
        keep = np.sort(np.random.default_rng([ctx.seed, 37]).choice(len(found), n, replace=False))
        found = Pool([found.examples[i] for i in keep], found.name)
    return found


# ----------------------------------------------------------------------------- brief training


def train_briefly(
    model: Any,
    items: list[dict],
    pad_token_id: int,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    checkpoints: Sequence[int] = (),
    on_checkpoint: Callable[[int, Any], None] | None = None,
    desc: str = "warm-up",
) -> Any:
    """AdamW on the model's trainable parameters, `epochs` passes over `items` in a seeded shuffled
    order, batch `batch_size`, constant `lr`, the trainer's loss (`weighted_lm_loss`, weights 1).
    After each optimizer step whose 1-based number is in `checkpoints` (and, when `checkpoints` is
    empty, after each epoch) calls on_checkpoint(step, optimizer) with the model in eval mode.
    Returns the optimizer. Single process: these are short proxy/warm-up runs, not the experiment."""
    import torch

    from repro.core.lmhead import weighted_lm_loss
    from repro.core.tokens import collate

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SelectionError("train_briefly: the model has no trainable parameters")
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    dev = params[0].device
    rng = np.random.default_rng([seed, 29])
    steps_per_epoch = -(-len(items) // batch_size)
    marks = set(checkpoints)
    bar = progress_bar(total=epochs * steps_per_epoch * batch_size, desc=desc, unit="ex")
    step = 0
    for _epoch in range(epochs):
        order = rng.permutation(len(items))
        model.train()
        for s in range(0, len(items), batch_size):
            b = collate([items[i] for i in order[s : s + batch_size]], pad_token_id)
            logits = model(
                input_ids=b["input_ids"].to(dev), attention_mask=b["attention_mask"].to(dev), use_cache=False
            ).logits
            loss = weighted_lm_loss(logits, b["labels"].to(dev), torch.ones(b["labels"].shape[0], device=dev))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            bar.update(batch_size)
            if step in marks and on_checkpoint is not None:
                model.eval()
                on_checkpoint(step, opt)
                model.train()
        if not marks and on_checkpoint is not None:
            model.eval()
            on_checkpoint(step, opt)
    bar.close()
    model.eval()
    return opt
