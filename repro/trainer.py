"""The data-parallel trainer: real torch.distributed, one process per worker.

Reads top to bottom: `train_worker` is what each process runs, in named steps: `_setup` (config,
model, this worker's examples, wrapping, optimizer), `_resume` (the newest checkpoint, or step 0),
the step loop (`_train_step` per optimizer step), `_checkpoint` and `_finish` (train.json, the
model). Checkpoints are written and read by repro/checkpoints.py. Worker k trains on exactly the
ordered ids that schedule.json gives it, step by step and micro-batch by micro-batch as
repro/core/steps.py forms them (the same steps the schedule stage's predicted idle share is
computed from), multiplying each example's loss by its weight (CluSTER's rank weight w_k, 1.0
otherwise). Loss normalization: each micro-batch's token mean over the accumulation steps; under
a schedule balanced in tokens each example's own token mean over the worker's mean examples per
step (steps.step_objective), so a worker's share of the update does not depend on how many
examples its steps hold. Gradients are averaged over workers, by DDP or by FSDP2
(`train.strategy`, repro/core/sharding.py), so one optimizer step follows sum_k (w_k / K) * grad_k
under either. Checkpoints every `train.checkpoint_every` steps (sharded under fsdp); a restarted
run resumes from the newest complete checkpoint and ends with the same weights as an
uninterrupted one, bit for bit (at any world size: see `settle_ddp_buckets` for what that takes
under DDP). A checkpoint also carries the training seconds and tokens so far, so `train_s` in
train.json counts every attempt's loop up to the checkpoint it resumed from.

Divergence: after each step's backward every worker checks its loss and the norm of its gradients
(its shards under fsdp); a flag all-reduced over the workers stops all of them together at the
first step where any is inf or NaN, before the optimizer applies it. train.json then says
`status: diverged` and `diverged_step`; no model is saved.

Per step and worker it logs loss, learning rate, gradient norm (before clipping; under fsdp the
norm of the worker's shards), compute seconds, seconds waiting at the gradient all-reduce (ddp:
from the moment this worker's last gradient bucket was ready until the synchronized gradients
were back; fsdp: null, its collectives run inside backward), tokens (real: attention_mask.sum()),
padded tokens (what the device computes: every micro-batch's rows x its longest), tokens/s and
peak memory, to
train_log/rank{k}.jsonl; rank 0 also sends its loss, lr, gradient norm, tokens/s and wait to the
experiment tracker `train.report_to` names (repro/core/tracking.py). train.json adds each
worker's bytes of parameters, gradients, optimizer state and DDP buckets (`state_bytes`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from repro.checkpoints import (
    _rng_state,
    _set_rng_state,
    checkpoint_meta,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from repro.core import sharding, steps
from repro.core.config.load import load_config
from repro.core.config.schema import ExperimentConfig
from repro.core.distributed import preload_in_workers
from repro.core.io import atomic_write_json, atomic_write_jsonl, read_json, read_jsonl
from repro.core.lmhead import weighted_lm_loss
from repro.core.log import get_logger, progress_bar
from repro.core.optim import optimizer_state_bytes
from repro.core.runtime import peak_memory_mb, seed_everything
from repro.core.sharding import enable_activation_checkpointing
from repro.core.steps import Derived
from repro.core.tracking import NoTracker, make_tracker
from repro.core.types import Example, Pool, Schedule

preload_in_workers(__name__)  # training workers start with this module imported

__all__ = [
    "TRACKED",
    "AllReduceTimer",
    "any_worker_diverged",
    "diverged_summary",
    "local_grad_norm",
    "make_optimizer",
    "make_scheduler",
    "run_training",
    "settle_ddp_buckets",
    "timed_allreduce_hook",
    "totals_so_far",
    "train_worker",
]

# The train_log fields rank 0 sends to the experiment tracker, as train/<field>.
TRACKED = ("loss", "lr", "grad_norm", "tokens_per_s", "allreduce_wait_s")

logger = get_logger("train")


# ----------------------------------------------------------------------------- pieces


class AllReduceTimer:
    """State for `timed_allreduce_hook`: when this worker's last gradient bucket was ready."""

    def __init__(self) -> None:
        self.last_ready = 0.0


# No annotations: DDP inspects a hook's signature and rejects string annotations.
def timed_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
    """A DDP comm hook: the default all-reduce (sum / world size), noting the ready time."""
    state.last_ready = time.perf_counter()
    return default_hooks.allreduce_hook(None, bucket)


def make_optimizer(cfg: ExperimentConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """`train.optimizer` over `params`; Adafactor is the paper recipe's (repro/core/optim.py)."""
    from repro.core.optim import make_optimizer as build

    return build(cfg.train.optimizer, params, cfg.train.lr, cfg.train.weight_decay)


def lr_schedule_steps(cfg: ExperimentConfig, derived: Derived) -> int:
    """The optimizer steps the learning-rate schedule spans (`train.schedule_steps`).

    kept: the run's own steps (derived.total_steps), so the linear schedule reaches 0 at the last
    step. pool: the steps the whole pool would take (method.md "The learning-rate schedule spans
    the full pool"): the pool dealt to the K workers, ceil(n_pool / K) examples each, in steps of
    per-device batch x accumulation rounded as train.drop_last, times the epochs (capped by
    train.max_steps), never fewer than the run's own steps. A run keeping a fraction f of the
    pool then ends at about (1 - f) of the peak learning rate."""
    if cfg.train.schedule_steps == "kept":
        return derived.total_steps
    per_worker = -(-derived.n_pool // derived.world_size)
    per_step = derived.per_worker_batch * derived.grad_accum
    per_epoch = per_worker // per_step if cfg.train.drop_last else -(-per_worker // per_step)
    pool_steps = per_epoch * cfg.train.epochs
    if cfg.train.max_steps is not None:
        pool_steps = min(pool_steps, cfg.train.max_steps)
    return max(pool_steps, derived.total_steps)


def make_scheduler(
    cfg: ExperimentConfig, opt: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule over `total_steps` (lr_schedule_steps)."""
    from repro.core.optim import make_scheduler as build

    return build(opt, cfg.train.warmup_steps, cfg.train.schedule == "linear", total_steps)


# ----------------------------------------------------------------------------- the worker


@dataclass
class _Worker:
    """What one worker's steps share, made once by `_setup`: its config, schedule, data, model
    (wrapped by the strategy), optimizer and scheduler."""

    t_start: float  # perf_counter() when the worker began (after its imports)
    rank: int
    world_size: int
    run_dir: Path
    cfg: ExperimentConfig
    derived: Derived
    schedule: Schedule
    device: torch.device
    threads: int
    bf16: bool
    autocast: bool
    tokenizer: Any
    tokenized: Any  # repro.core.data.TokenizedPool of this worker's ids
    lengths: dict[str, int]  # tokens of each of this worker's ids (for train.length_grouped)
    collate: Callable[..., dict[str, torch.Tensor]]
    wrapped: torch.nn.Module
    timer: AllReduceTimer
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR

    @property
    def strategy(self) -> str:
        return self.cfg.train.strategy

    def micro_batch(self, step: int, micro: int) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Micro-batch `micro` of optimizer step `step` on this worker, on its device. A schedule
        with step_sizes (steps balanced in tokens): this worker's steps may hold more or fewer ids
        than per_step, in `accum` near-equal micro-batches, never empty (repro/core/steps.py);
        under train.length_grouped the step's ids ordered by length first."""
        d = self.derived
        b, accum = d.per_worker_batch, d.grad_accum
        epoch, s = divmod(step, d.steps_per_epoch)
        grouped = self.cfg.train.length_grouped
        chunk = steps.step_micro_batches(
            self.schedule, epoch, self.rank, s, b, accum, self.lengths if grouped else None, grouped
        )[micro]
        batch = self.collate([self.tokenized[i] for i in chunk], self.tokenizer.pad_token_id)
        return {k: v.to(self.device) for k, v in batch.items()}, chunk


def train_worker(rank: int, world_size: int, run_dir_str: str) -> None:
    """One data-parallel worker. The process group is already initialized."""
    w = _setup(rank, world_size, Path(run_dir_str))
    start_step, carried, ckpt = _resume(w)
    log = _open_log(w.run_dir / "train_log" / f"rank{rank}.jsonl", start_step)
    if start_step and w.strategy == "ddp":
        batch, _ = w.micro_batch(start_step, 0)
        settle_ddp_buckets(w.wrapped, batch, w.autocast)
    t_loop = time.perf_counter()
    total_steps = w.derived.total_steps
    if rank == 0 and start_step:
        logger.info(f"resuming from {ckpt} at step {start_step}/{total_steps}")
    progress = progress_bar(
        total=total_steps, initial=start_step, desc="train", unit="step", enabled=rank == 0, logger=logger
    )
    cfg, run_dir = w.cfg, w.run_dir
    tracker = (
        make_tracker(cfg.train.report_to, run_dir, f"{cfg.name}-{run_dir.name}", cfg.to_dict(), start_step)
        if rank == 0
        else NoTracker()
    )
    totals: dict[str, Any] = {"tokens": 0, "padded_tokens": 0, "compute_s": 0.0, "wait_s": 0.0, "steps": 0}
    diverged_at: int | None = None
    for step in range(start_step, total_steps):
        row = _train_step(w, step, step == start_step, totals)
        if row is None:  # a worker's loss or gradients are not finite: all stop here
            diverged_at = step
            break
        log.write(json.dumps(row) + "\n")
        log.flush()
        tracker.log({f"train/{k}": row[k] for k in TRACKED if row[k] is not None}, step)
        progress.set_postfix(loss=f"{row['loss']:.3f}")
        progress.update(1)
        done = step + 1
        if cfg.train.checkpoint_every and done % cfg.train.checkpoint_every == 0 and done < total_steps:
            _checkpoint(w, done, time.perf_counter() - t_loop, totals["tokens"], carried, tracker)
    log.close()
    progress.close()
    tracker.close()
    totals.update(loop_s=time.perf_counter() - t_loop, startup_s=t_loop - w.t_start)
    _finish(w, totals, start_step, carried, diverged_at)


def _setup(rank: int, world_size: int, run_dir: Path) -> _Worker:
    """Read the run folder, load the model and this worker's examples, wrap the model for the
    strategy and make the optimizer and scheduler."""
    from repro.core.distributed import set_worker_threads, worker_device
    from repro.core.models import load_model_and_tokenizer
    from repro.core.rundir import model_dir_of
    from repro.core.tokens import TokenizedPool, collate

    t_start = time.perf_counter()  # startup_s: from here to the first step
    cfg = load_config(run_dir / "config.yaml")
    derived = Derived(**read_json(run_dir / "derived.json"))
    schedule = Schedule.from_dict(read_json(run_dir / "schedule.json"))
    model_dir = model_dir_of(run_dir)
    assert schedule.world_size == world_size, "schedule.json was made for another world size"

    use_cuda = torch.cuda.is_available()
    device = worker_device(rank)  # the CUDA device of its local rank (SLURM_LOCALID under srun)
    threads = set_worker_threads(world_size, cfg.launch.torch_threads)
    bf16 = use_cuda and cfg.model.precision in ("auto", "bf16")

    # The same seed on every rank: identical LoRA init (DDP also broadcasts).
    seed_everything(cfg.seed_for_training())
    # fsdp: load on the CPU and let fully_shard move each layer's shard to the device, so no
    # GPU ever holds the whole fp32 model (13B: 52 GB); ddp: every GPU holds it anyway.
    on_load = "cpu" if cfg.train.strategy == "fsdp" else str(device)
    if use_cuda:
        torch.cuda.set_device(device)  # FSDP's default mesh and NCCL use the current device
    model, tokenizer = load_model_and_tokenizer(model_dir, cfg.model, device=on_load)
    model.train()

    my_ids = {i for epoch in schedule.order for i in epoch[rank]}
    pool = Pool([Example.from_dict(r) for r in read_jsonl(run_dir / "pool.jsonl") if r["id"] in my_ids])
    tokenized = TokenizedPool(pool, tokenizer, cfg.data.max_length, on_bad_row="error")
    lengths = {i: len(tokenized[i]["input_ids"]) for i in tokenized.ids}

    # Wrap first: under fsdp the optimizer must see the sharded parameters (DTensors).
    strategy = cfg.train.strategy
    if cfg.train.activation_checkpointing:
        enable_activation_checkpointing(model)
    wrapped = sharding.wrap(model, strategy, device, bf16)
    timer = AllReduceTimer()
    if strategy == "ddp":  # FSDP's collectives run inside backward: no comm hook to time them
        wrapped.register_comm_hook(timer, timed_allreduce_hook)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    opt = make_optimizer(cfg, params)
    sched = make_scheduler(cfg, opt, lr_schedule_steps(cfg, derived))
    return _Worker(
        t_start=t_start,
        rank=rank,
        world_size=world_size,
        run_dir=run_dir,
        cfg=cfg,
        derived=derived,
        schedule=schedule,
        device=device,
        threads=threads,
        bf16=bf16,
        autocast=sharding.autocast_enabled(strategy, bf16),
        tokenizer=tokenizer,
        tokenized=tokenized,
        lengths=lengths,
        collate=collate,
        wrapped=wrapped,
        timer=timer,
        params=params,
        opt=opt,
        sched=sched,
    )


def _resume(w: _Worker) -> tuple[int, dict[str, Any], Path | None]:
    """(the step to start from, the training seconds and tokens carried over, the checkpoint):
    the newest complete checkpoint's state loaded into the model, optimizer and scheduler, or
    step 0 with this rank's own random stream (dropout etc.) when there is none."""
    start_step, carried = 0, {"train_s": 0.0, "tokens": 0}
    ckpt = latest_checkpoint(w.run_dir)
    if ckpt is not None:
        start_step = load_checkpoint(
            ckpt, sharding.unwrapped(w.wrapped), w.opt, w.sched, w.rank, w.world_size, w.strategy
        )
        meta = checkpoint_meta(ckpt)
        carried = {"train_s": float(meta["train_s"]), "tokens": int(meta["tokens"])}
    else:
        seed_everything(w.cfg.seed_for_training() + w.rank)  # per-rank stream for dropout etc.
    return start_step, carried, ckpt


def _open_log(log_path: Path, start_step: int) -> Any:
    """This worker's train_log, open for appending, keeping only the rows before `start_step`
    (a resumed run's later rows are written again)."""
    old_rows = read_jsonl(log_path) if log_path.is_file() else []
    atomic_write_jsonl(log_path, [r for r in old_rows if r["step"] < start_step])
    return open(log_path, "a", encoding="utf-8")


def _train_step(w: _Worker, step: int, first: bool, totals: dict[str, Any]) -> dict[str, Any] | None:
    """Optimizer step `step`: its micro-batches forward and backward (gradients synchronized on
    the last), the divergence check, clipping, the optimizer and scheduler. Adds the step to
    `totals` (and, on the attempt's first step, the state bytes) and returns its train_log row;
    None when a worker diverged (totals["diverged"] says how), before the optimizer applies it."""
    rank, strategy, accum = w.rank, w.strategy, w.derived.grad_accum
    epoch = step // w.derived.steps_per_epoch
    per_example, divisor = steps.step_objective(w.schedule, epoch, rank, accum)
    t0 = time.perf_counter()
    wait = 0.0
    tokens = 0
    padded = 0  # positions the device computes: rows x the micro-batch's longest row
    loss_sum = 0.0
    for micro in range(accum):
        batch, chunk = w.micro_batch(step, micro)
        weights = torch.tensor([w.schedule.weight(i, rank) for i in chunk], device=w.device)
        tokens += int(batch["attention_mask"].sum())
        padded += int(batch["attention_mask"].numel())
        sync = micro == accum - 1
        with sharding.gradient_sync(w.wrapped, strategy, sync):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=w.autocast):
                logits = w.wrapped(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                ).logits
            loss = weighted_lm_loss(logits, batch["labels"], weights, per_example) / divisor
            loss.backward()
            if sync and strategy == "ddp":
                wait = max(0.0, time.perf_counter() - w.timer.last_ready)
        loss_sum += float(loss.detach())
    if first:  # the model state each strategy shards, measured once
        totals["state_bytes"] = sharding.state_bytes(w.wrapped, w.opt, strategy)
    grad_norm = local_grad_norm(w.params)
    if any_worker_diverged(loss_sum, grad_norm, w.device):  # every rank gets the same answer
        totals["diverged"] = {"loss": _json_number(loss_sum), "grad_norm": _json_number(float(grad_norm))}
        return None
    if w.cfg.train.grad_clip:
        torch.nn.utils.clip_grad_norm_(w.params, w.cfg.train.grad_clip)
    w.opt.step()
    if first:  # optimizer state exists after the first step
        totals["state_bytes"]["optimizer"] = optimizer_state_bytes(w.opt)
    w.sched.step()
    w.opt.zero_grad(set_to_none=True)
    step_s = time.perf_counter() - t0
    totals["tokens"] += tokens
    totals["padded_tokens"] += padded
    totals["compute_s"] += step_s - wait
    totals["wait_s"] += wait
    totals["steps"] += 1
    return {
        "step": step,
        "rank": rank,
        "epoch": epoch,
        "loss": loss_sum,
        "lr": w.sched.get_last_lr()[0],
        "grad_norm": float(grad_norm),
        "step_s": step_s,
        "compute_s": step_s - wait,
        "allreduce_wait_s": wait if strategy == "ddp" else None,
        "tokens": tokens,
        "padded_tokens": padded,
        "tokens_per_s": tokens / step_s,
        "peak_mem_mb": peak_memory_mb(w.device),
    }


def _checkpoint(
    w: _Worker, done: int, loop_s: float, tokens: int, carried: dict[str, Any], tracker: Any
) -> None:
    """A checkpoint after `done` steps, with the training seconds and tokens up to it (every
    attempt's, the carried ones included); the tracker is flushed first."""
    so_far = totals_so_far(loop_s, tokens, w.device)
    tracker.flush()  # durable before the checkpoint a killed run would resume from
    save_checkpoint(
        w.run_dir,
        done,
        sharding.unwrapped(w.wrapped),
        w.opt,
        w.sched,
        w.rank,
        w.world_size,
        w.cfg.train.keep_checkpoints,
        w.strategy,
        progress={"train_s": carried["train_s"] + so_far[0], "tokens": carried["tokens"] + so_far[1]},
    )


def _finish(
    w: _Worker, totals: dict[str, Any], start_step: int, carried: dict[str, Any], diverged_at: int | None
) -> None:
    """Gather every worker's totals; rank 0 saves the model (unless training diverged) and writes
    train.json."""
    from repro.core.models import save_finetuned
    from repro.run_rows import train_log_totals

    strategy = w.strategy
    totals.update(peak_mem_mb=peak_memory_mb(w.device), threads=w.threads)
    gathered: list[Any] = [None] * w.world_size
    dist.all_gather_object(gathered, totals)
    # Under fsdp the weights are gathered (a collective) to rank 0's CPU first. Every rank knows
    # whether training diverged (the flag was all-reduced), so all skip this collective together.
    full = (
        sharding.full_state_dict(w.wrapped, trainable_only=w.cfg.model.lora.enabled)
        if strategy == "fsdp" and diverged_at is None
        else None
    )
    if w.rank == 0:
        if diverged_at is None:
            save_finetuned(sharding.unwrapped(w.wrapped), w.tokenizer, w.run_dir / "model", state_dict=full)
        this_s = max(g["loop_s"] for g in gathered)
        train_s = carried["train_s"] + this_s
        tok = carried["tokens"] + sum(g["tokens"] for g in gathered)
        step_time = sum(g["compute_s"] + g["wait_s"] for g in gathered)
        atomic_write_json(
            w.run_dir / "train.json",
            {
                "status": "ok" if diverged_at is None else "diverged",
                "train_s": train_s,
                "train_s_carried": carried["train_s"],
                "startup_s": max(g["startup_s"] for g in gathered),
                "steps_run": gathered[0]["steps"],
                "resumed_from_step": start_step,
                "total_steps": w.derived.total_steps,
                "lr_schedule_steps": lr_schedule_steps(w.cfg, w.derived),
                "tokens": tok,
                # every step once, from the workers' logs (a resumed run's earlier steps too)
                "padded_tokens": train_log_totals(w.run_dir)["padded_tokens"],
                "length_grouped": w.cfg.train.length_grouped,
                "tokens_per_s": tok / train_s if train_s > 0 else None,
                "allreduce_wait_share": (
                    sum(g["wait_s"] for g in gathered) / step_time
                    if step_time > 0 and strategy == "ddp"
                    else None
                ),
                "strategy": strategy,
                "activation_checkpointing": w.cfg.train.activation_checkpointing,
                "peak_mem_mb": max(g["peak_mem_mb"] for g in gathered),
                "per_worker": gathered,
                "device": str(w.device.type),
                "bf16": w.bf16,
                **(diverged_summary(diverged_at, gathered) if diverged_at is not None else {}),
            },
        )
    dist.barrier()


# ----------------------------------------------------------------------------- divergence


def local_grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The 2-norm of this worker's gradients (only its shards under fsdp: no communication), as
    a 0-d float tensor; inf or NaN when any gradient element is (or the norm overflows)."""
    grads = [
        p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params if p.grad is not None
    ]
    if not grads:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0).float()


def any_worker_diverged(loss: float, grad_norm: torch.Tensor, device: torch.device) -> bool:
    """Whether any worker's loss or gradient norm is non-finite: one all-reduced flag, so every
    rank stops at the same step and none waits for the others in a collective."""
    bad = float(not math.isfinite(loss) or not bool(torch.isfinite(grad_norm)))
    flag = torch.tensor([bad], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def _json_number(x: float) -> float | str:
    """x, or "nan" / "inf" / "-inf" as text (strict JSON has no non-finite numbers)."""
    return x if math.isfinite(x) else str(x)


def diverged_summary(step: int, gathered: list[dict[str, Any]]) -> dict[str, Any]:
    """train.json fields of a diverged training: the step, and each worker's loss and norm."""
    losses = [g["diverged"]["loss"] for g in gathered]
    norms = [g["diverged"]["grad_norm"] for g in gathered]
    what = [
        name
        for name, vals in (("loss", losses), ("gradient norm", norms))
        if any(isinstance(v, str) for v in vals)
    ]
    return {
        "diverged_step": step,
        "diverged": {"what": " and ".join(what), "loss": losses, "grad_norm": norms},
    }


# ----------------------------------------------------------------------------- resume


def totals_so_far(loop_s: float, tokens: int, device: torch.device) -> tuple[float, int]:
    """(this attempt's loop seconds, slowest worker; its tokens, all workers) at a checkpoint."""
    t = torch.tensor([loop_s], dtype=torch.float64, device=device)
    n = torch.tensor([float(tokens)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.all_reduce(n)
    return float(t.item()), int(n.item())


def settle_ddp_buckets(model: torch.nn.Module, batch: dict[str, torch.Tensor], autocast: bool) -> None:
    """Before the first step of a resumed DDP run: one forward and backward of a zero loss, so
    DDP's gradient buckets are laid out as in the uninterrupted run.

    DDP reduces gradients in one bucket in the first iteration and then rebuilds its buckets in
    the order gradients became ready. An element's place in a bucket decides how the all-reduce
    (a ring) orders the addition of the workers' values; with 3 or more workers floating-point
    addition in another order gives other bits (up to 1.5e-8 at 4 workers, measured), with 2 it
    cannot (a + b = b + a). A resumed run would do its first step in the first-iteration layout
    while the uninterrupted run is in the rebuilt one. This pass (zero gradients, all-reduced)
    lets DDP record the ready order, so it rebuilds before the real step. The RNG state is
    restored afterwards, so dropout draws are as in the uninterrupted run.
    """
    rng = _rng_state()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    (logits.float().sum() * 0.0).backward()
    _set_rng_state(rng)
    for p in model.parameters():
        p.grad = None


def run_training(run_dir: Path, world_size: int, master_port: int | None = None) -> dict[str, Any]:
    """Train with `world_size` workers: this process's SLURM/torchrun group when it was launched
    into one of that size (every task calls this), else as many processes spawned here."""
    from repro.core.distributed import run_group
    from repro.core.fingerprints import verify_run_file

    for name in ("schedule.json", "derived.json", "pool.jsonl"):  # what _setup reads
        verify_run_file(run_dir, name)
    run_group(train_worker, world_size, (str(run_dir),), join_size=world_size, master_port=master_port)
    return read_json(run_dir / "train.json")
