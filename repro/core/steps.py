"""How a schedule becomes optimizer steps, and what its stragglers are predicted to cost.

One owner of step formation: the trainer, the pipeline's schedule stage and the benchmarks all
take a worker's ids of a step from `step_ids`, its micro-batches from `step_micro_batches` and the
loss normalization from `step_objective`, so the prediction below is made from exactly the
steps the trainer runs.

Steps: without `Schedule.step_sizes`, step s of an epoch takes ids s*P .. (s+1)*P - 1 of every
worker's list (P = per-device batch x accumulation), split into accumulation micro-batches of the
per-device batch. With step_sizes (an allocator that balances steps in tokens), step s takes the
next step_sizes[e][k][s] ids of worker k, split into accumulation near-equal micro-batches (none
empty: the allocator gives every step at least accumulation ids), so every worker runs the same
number of forward/backward micro-steps and DDP's or FSDP's collectives match across workers.

Straggler model: data-parallel workers meet at every optimizer step's gradient all-reduce, so a
step lasts as long as its slowest worker. A worker's compute in a step is taken as proportional to
the tokens its device computes: its micro-batches are right-padded to their longest row
(repro/core/tokens.py collate), so a micro-batch costs len(batch) x its longest row, its *padded*
tokens (at per-device batch 1, the paper's, padded = real). The step lasts in proportion to the
largest worker sum, and worker k sits idle for the share 1 - sum_k / max of it. The predicted
idle share of a run is the mean over its optimizer steps of 1 - mean_k(sum_k) / max_k(sum_k),
which is also the mean of the workers' own idle shares. The real tokens (prompt + response +
eos, `attention_mask.sum()`) are kept beside: `step_tokens` and the `_real` figures of
`straggler_summary`. It needs only the tokenizer and the schedule, so it is known before
training; the trainer's all-reduce wait share (train.json) is what it predicts, measured.

Length grouping (`train.length_grouped`, off by default): inside each worker's optimizer step the
ids are ordered by length (shortest first, ties in schedule order) before they are cut into
micro-batches, so rows of like length share a micro-batch and less is padded. The step's set of
examples is unchanged; which examples share a micro-batch, and the order of the micro-steps, are
not (under the fixed steps' per-micro-batch token mean that changes the update; under the
balanced steps' per-example objective it does not, up to floating-point order). With one
micro-batch per step (accumulation 1) there is nothing to regroup and it saves nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from repro.core.config.builder import ConfigError
from repro.core.types import Example, Schedule

if TYPE_CHECKING:
    from repro.core.config.schema import ExperimentConfig


def token_lengths(examples: list[Example], model_dir: Path, max_length: int) -> dict[str, int]:
    """{id: tokens the trainer feeds for it} (prompt + response + eos, cut at max_length), with
    the model's own tokenizer, as the pool stage and the trainer tokenize."""
    from transformers import AutoTokenizer

    from repro.core.tokens import TokenizedPool
    from repro.core.types import Pool

    tok = AutoTokenizer.from_pretrained(model_dir)
    tp = TokenizedPool(Pool(list(examples)), tok, max_length)
    return {i: len(tp[i]["input_ids"]) for i in tp.ids}


def step_ids(schedule: Schedule, epoch: int, worker: int, step: int, per_step: int) -> list[str]:
    """The ids `worker` trains on in optimizer step `step` (0-based within `epoch`)."""
    ids = schedule.order[epoch][worker]
    if schedule.step_sizes is None:
        return ids[step * per_step : (step + 1) * per_step]
    sizes = schedule.step_sizes[epoch][worker]
    start = sum(sizes[:step])
    return ids[start : start + sizes[step]]


def length_grouped(ids: list[str], lengths: dict[str, int]) -> list[str]:
    """A step's ids ordered by length, shortest first (ties keep the schedule's order): the same
    ids, so the step's examples are unchanged, in micro-batches of like length."""
    return sorted(ids, key=lambda i: lengths[i])


def step_micro_batches(
    schedule: Schedule,
    epoch: int,
    worker: int,
    step: int,
    per_device_batch: int,
    accum: int,
    lengths: dict[str, int] | None = None,
    grouped: bool = False,
) -> list[list[str]]:
    """The micro-batches `worker` runs in optimizer step `step` of `epoch`, in order: what the
    trainer feeds and what the padded counts below are taken from. `grouped`
    (train.length_grouped) orders the step's ids by `lengths` first."""
    ids = step_ids(schedule, epoch, worker, step, per_device_batch * accum)
    if grouped:
        if lengths is None:
            raise ValueError("length-grouped micro-batches need the examples' token lengths")
        ids = length_grouped(ids, lengths)
    return micro_batches(ids, accum, per_device_batch, schedule.step_sizes is not None)


def padded_tokens(batch: list[str], lengths: dict[str, int]) -> int:
    """Positions the device computes for one micro-batch: its rows x its longest row (collate
    right-pads every row to the longest)."""
    return len(batch) * max((lengths[i] for i in batch), default=0)


def micro_batches(ids: list[str], accum: int, per_device_batch: int, even: bool) -> list[list[str]]:
    """A worker's step as its `accum` micro-batches, in order.

    even False (fixed steps): consecutive slices of per_device_batch. even True (a schedule with
    step_sizes): the ids in accum near-equal parts, the larger ones first, so a worker with more
    (shorter) examples in a step takes more per micro-batch rather than more micro-steps."""
    if not even:
        return [ids[m * per_device_batch : (m + 1) * per_device_batch] for m in range(accum)]
    q, extra = divmod(len(ids), accum)
    out, start = [], 0
    for m in range(accum):
        n = q + (1 if m < extra else 0)
        out.append(ids[start : start + n])
        start += n
    return out


def step_objective(schedule: Schedule, epoch: int, worker: int, accum: int) -> tuple[bool, float]:
    """How a worker's micro-batch loss is normalized: (per_example, divisor) for
    `weighted_lm_loss(..., per_example=per_example) / divisor` (repro/core/lmhead.py).

    Fixed steps: the micro-batch's token mean over accumulation, (False, accum), as always.
    Balanced steps: each example's own token mean, over the worker's mean examples per step in
    the epoch, (True, len(ids) / steps). A worker then contributes w_k times the mean over its
    examples per step on average, whatever it takes in one step: what the fixed steps give at
    per-device batch 1 (the paper's), so rank weights keep each cluster's share of the objective.
    """
    if schedule.step_sizes is None:
        return False, float(accum)
    sizes = schedule.step_sizes[epoch][worker]
    return True, sum(sizes) / len(sizes)


def step_token_sums(
    schedule: Schedule, lengths: dict[str, int], per_step: int, steps_per_epoch: int, total_steps: int
) -> np.ndarray:
    """total_steps x K: the real tokens each worker processes in each optimizer step the trainer runs."""
    k = schedule.world_size
    out = np.zeros((total_steps, k), dtype=np.int64)
    for step in range(total_steps):
        epoch, s = divmod(step, steps_per_epoch)
        for w in range(k):
            out[step, w] = sum(lengths[i] for i in step_ids(schedule, epoch, w, s, per_step))
    return out


def step_padded_token_sums(
    schedule: Schedule,
    lengths: dict[str, int],
    per_device_batch: int,
    accum: int,
    steps_per_epoch: int,
    total_steps: int,
    grouped: bool = False,
) -> np.ndarray:
    """total_steps x K: the padded tokens each worker's device computes in each optimizer step
    (per micro-batch its rows x its longest row, summed over the step's micro-batches)."""
    k = schedule.world_size
    out = np.zeros((total_steps, k), dtype=np.int64)
    for step in range(total_steps):
        epoch, s = divmod(step, steps_per_epoch)
        for w in range(k):
            mbs = step_micro_batches(schedule, epoch, w, s, per_device_batch, accum, lengths, grouped)
            out[step, w] = sum(padded_tokens(mb, lengths) for mb in mbs if mb)
    return out


def worker_idle_shares(sums: np.ndarray) -> np.ndarray:
    """Per worker: the mean over steps of 1 - its token sum / the step's largest."""
    sums = np.asarray(sums, dtype=np.float64)
    if sums.ndim != 2 or sums.shape[0] == 0:
        raise ValueError(f"step token sums must be steps x workers with >= 1 step, got shape {sums.shape}")
    top = sums.max(axis=1, keepdims=True)
    if (top <= 0).any():
        raise ValueError("a step has no tokens on any worker")
    return (1.0 - sums / top).mean(axis=0)


def idle_share(sums: np.ndarray) -> float:
    """The predicted idle share: mean over steps of 1 - mean/max of the workers' token sums."""
    return float(worker_idle_shares(sums).mean())


def straggler_summary(
    schedule: Schedule,
    lengths: dict[str, int],
    per_step: int,
    steps_per_epoch: int,
    total_steps: int,
    accum: int | None = None,
    grouped: bool = False,
) -> dict[str, Any]:
    """What the schedule stage records (step_tokens.json): every step's per-worker token sums,
    real (`step_tokens`) and padded (`step_padded_tokens`: per micro-batch, rows x its longest
    row; `accum` micro-batches of per_step / accum rows, `grouped` as train.length_grouped; with
    accum None, per-device batch 1: padded = real), each worker's idle share and the run's
    predicted idle share from the padded sums (what the device computes), with the real-token
    ones beside (`_real`; None with one worker: no one to wait for), and the sum over steps of
    the busiest worker's padded and real tokens (`busiest_padded_tokens`, `busiest_tokens`: what
    a run's time is taken as proportional to)."""
    sums = step_token_sums(schedule, lengths, per_step, steps_per_epoch, total_steps)
    if accum is None:
        padded = sums.copy()
    else:
        padded = step_padded_token_sums(
            schedule, lengths, per_step // accum, accum, steps_per_epoch, total_steps, grouped
        )
    multi = schedule.world_size > 1
    return {
        "predicted_idle_share": idle_share(padded) if multi else None,
        "worker_idle_shares": worker_idle_shares(padded).tolist() if multi else None,
        "predicted_idle_share_real": idle_share(sums) if multi else None,
        "worker_idle_shares_real": worker_idle_shares(sums).tolist() if multi else None,
        "world_size": schedule.world_size,
        "steps": int(total_steps),
        "length_grouped": bool(grouped),
        "tokens": int(sums.sum()),
        "padded_tokens": int(padded.sum()),
        "busiest_tokens": int(sums.max(axis=1).sum()),
        "busiest_padded_tokens": int(padded.max(axis=1).sum()),
        "step_tokens": sums.tolist(),
        "step_padded_tokens": padded.tolist(),
    }


# ----------------------------------------------------------------------------- derived


def grad_accum(cfg: ExperimentConfig) -> int:
    """Micro-steps per optimizer step: global batch / (per-device batch x world size)."""
    t = cfg.train
    return t.global_batch_size // (t.per_device_batch_size * cfg.world_size)


@dataclass
class Derived:
    """Numbers computed once from the config and the selection size, saved with the run."""

    n_pool: int
    n_selected: int
    world_size: int
    per_worker_batch: int
    grad_accum: int
    global_batch: int
    examples_per_worker_per_epoch: int
    steps_per_epoch: int
    total_steps: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def derive(
    cfg: ExperimentConfig,
    n_pool: int,
    n_selected: int,
    per_worker_len: int,
    steps_per_epoch: int | None = None,
) -> Derived:
    """Steps, per-worker batch and accumulation from the config and the schedule length.

    `per_worker_len` is how many examples each worker sees per epoch (from the schedule; the most
    of any worker when the schedule sets its own steps). A partial last optimizer step is dropped
    when `train.drop_last` (as the authors' loader does). `steps_per_epoch`: the schedule's own
    count (Schedule.step_sizes, steps balanced in tokens), used as it is.
    """
    t = cfg.train
    accum = grad_accum(cfg)
    per_step = t.per_device_batch_size * accum
    if steps_per_epoch is None and t.drop_last:
        steps_per_epoch = per_worker_len // per_step
    elif steps_per_epoch is None:
        steps_per_epoch = -(-per_worker_len // per_step)
    total = steps_per_epoch * t.epochs
    if t.max_steps is not None:
        total = min(total, t.max_steps)
    if total < 1:
        raise ConfigError(
            f"train: {n_selected} selected examples over {cfg.world_size} workers give "
            f"{per_worker_len} per worker, fewer than one optimizer step of "
            f"per_device_batch_size x grad_accum = {per_step}; lower train.global_batch_size "
            "or select more data"
        )
    return Derived(
        n_pool=n_pool,
        n_selected=n_selected,
        world_size=cfg.world_size,
        per_worker_batch=t.per_device_batch_size,
        grad_accum=accum,
        global_batch=t.global_batch_size,
        examples_per_worker_per_epoch=per_worker_len,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
    )
