"""The data-parallel trainer: real torch.distributed, one process per worker.

Reads top to bottom: `train_worker` is what each process runs. Worker k trains on exactly the
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
were back; fsdp: null, its collectives run inside backward), tokens, tokens/s and peak memory, to
train_log/rank{k}.jsonl; rank 0 also sends its loss, lr, gradient norm, tokens/s and wait to the
experiment tracker `train.report_to` names (repro/core/tracking.py). train.json adds each
worker's bytes of parameters, gradients, optimizer state and DDP buckets (`state_bytes`).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from repro.core import sharding, steps
from repro.core.config import Derived, ExperimentConfig, load_config
from repro.core.distributed import preload_in_workers
from repro.core.io import atomic_write_json, atomic_write_jsonl, read_json, read_jsonl
from repro.core.lmhead import weighted_lm_loss
from repro.core.log import get_logger, progress_bar
from repro.core.optim import optimizer_state_bytes
from repro.core.runtime import peak_memory_mb, seed_everything
from repro.core.sharding import enable_activation_checkpointing
from repro.core.tracking import NoTracker, make_tracker
from repro.core.types import Example, Pool, Schedule

preload_in_workers(__name__)  # training workers start with this module imported

CKPT_DIR = "checkpoints"
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


def make_scheduler(
    cfg: ExperimentConfig, opt: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    from repro.core.optim import make_scheduler as build

    return build(opt, cfg.train.warmup_steps, cfg.train.schedule == "linear", total_steps)


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


# ----------------------------------------------------------------------------- checkpoints


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (complete ones are renamed into place as a whole)."""
    d = run_dir / CKPT_DIR
    done = sorted(p for p in d.glob("step-*") if (p / "meta.json").is_file()) if d.is_dir() else []
    return done[-1] if done else None


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    rank: int,
    world_size: int,
    keep: int,
    strategy: str = "ddp",
    progress: dict[str, Any] | None = None,
) -> None:
    """All ranks call this together; each writes its RNG state. Under ddp rank 0 writes the
    trainable weights and optimizer state; under fsdp every rank writes its shards (dcp/).
    `progress` (train_s, tokens: totals over all attempts so far) goes into meta.json."""
    from repro.core.models import trainable_state_dict
    from repro.core.sharding import save_sharded

    root = run_dir / CKPT_DIR
    final = root / f"step-{step:07d}"
    tmp = root / f".step-{step:07d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    torch.save(_rng_state(), tmp / f"rng-rank{rank}.pt")
    if strategy == "fsdp":
        save_sharded(tmp / "dcp", model, opt)
    elif rank == 0:
        torch.save(trainable_state_dict(model), tmp / "trainable.pt")
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
    if rank == 0:
        torch.save(sched.state_dict(), tmp / "scheduler.pt")
    dist.barrier()
    if rank == 0:
        (tmp / "meta.json").write_text(
            json.dumps({"step": step, "world_size": world_size, "strategy": strategy, **(progress or {})})
        )
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def checkpoint_meta(ckpt: Path) -> dict[str, Any]:
    """meta.json of a checkpoint: step, world_size, strategy and (since they are recorded)
    train_s and tokens, the totals of every attempt up to this checkpoint."""
    return json.loads((ckpt / "meta.json").read_text())


def load_checkpoint(
    ckpt: Path,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    rank: int,
    world_size: int,
    strategy: str = "ddp",
) -> int:
    from repro.core.models import load_trainable_state_dict
    from repro.core.sharding import load_sharded

    meta = checkpoint_meta(ckpt)
    if meta["world_size"] != world_size:
        raise RuntimeError(
            f"{ckpt}: written with world_size {meta['world_size']}, resumed with "
            f"{world_size}; resume with the same world size or use --force"
        )
    written = meta.get("strategy", "ddp")
    if written != strategy:
        raise RuntimeError(
            f"{ckpt}: written with train.strategy={written}, resumed with "
            f"{strategy}; resume with the same strategy or use --force"
        )
    if strategy == "fsdp":
        load_sharded(ckpt / "dcp", model, opt)
    else:
        load_trainable_state_dict(model, torch.load(ckpt / "trainable.pt", weights_only=True))
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=False))
    sched.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False))
    _set_rng_state(torch.load(ckpt / f"rng-rank{rank}.pt", weights_only=False))
    return int(meta["step"])


# ----------------------------------------------------------------------------- the worker


def train_worker(rank: int, world_size: int, run_dir_str: str) -> None:
    """One data-parallel worker. The process group is already initialized."""
    from repro.core.data import TokenizedPool, collate
    from repro.core.distributed import set_worker_threads, worker_device
    from repro.core.models import load_model_and_tokenizer, save_finetuned
    from repro.core.rundir import model_dir_of

    t_start = time.perf_counter()
    run_dir = Path(run_dir_str)
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
    sched = make_scheduler(cfg, opt, derived.total_steps)

    start_step, carried = 0, {"train_s": 0.0, "tokens": 0}
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        start_step = load_checkpoint(
            ckpt, sharding.unwrapped(wrapped), opt, sched, rank, world_size, strategy
        )
        meta = checkpoint_meta(ckpt)  # older checkpoints carry no totals: this attempt's only
        carried = {"train_s": float(meta.get("train_s", 0.0)), "tokens": int(meta.get("tokens", 0))}
    else:
        seed_everything(cfg.seed_for_training() + rank)  # per-rank stream for dropout etc.

    log_path = run_dir / "train_log" / f"rank{rank}.jsonl"
    old_rows = read_jsonl(log_path) if log_path.is_file() else []
    atomic_write_jsonl(log_path, [r for r in old_rows if r["step"] < start_step])
    log = open(log_path, "a", encoding="utf-8")

    b, accum = derived.per_worker_batch, derived.grad_accum
    per_step = b * accum
    pad_id = tokenizer.pad_token_id
    autocast = sharding.autocast_enabled(strategy, bf16)
    # A schedule with step_sizes (steps balanced in tokens): this worker's steps may hold more or
    # fewer ids than per_step, in `accum` near-equal micro-batches, never empty (repro/core/steps.py).
    even = schedule.step_sizes is not None

    def micro_batch(step: int, micro: int) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Micro-batch `micro` of optimizer step `step` on this worker, on its device."""
        epoch, s = divmod(step, derived.steps_per_epoch)
        ids = steps.step_ids(schedule, epoch, rank, s, per_step)
        chunk = steps.micro_batches(ids, accum, b, even)[micro]
        batch = collate([tokenized[i] for i in chunk], pad_id)
        return {k: v.to(device) for k, v in batch.items()}, chunk

    if start_step and strategy == "ddp":
        batch, _ = micro_batch(start_step, 0)
        settle_ddp_buckets(wrapped, batch, autocast)
    t_loop = time.perf_counter()
    if rank == 0 and start_step:
        logger.info(f"resuming from {ckpt} at step {start_step}/{derived.total_steps}")
    progress = progress_bar(
        total=derived.total_steps,
        initial=start_step,
        desc="train",
        unit="step",
        enabled=rank == 0,
        logger=logger,
    )
    tracker = (
        make_tracker(cfg.train.report_to, run_dir, f"{cfg.name}-{run_dir.name}", cfg.to_dict(), start_step)
        if rank == 0
        else NoTracker()
    )
    totals: dict[str, Any] = {"tokens": 0, "compute_s": 0.0, "wait_s": 0.0, "steps": 0}
    diverged_at: int | None = None
    for step in range(start_step, derived.total_steps):
        epoch = step // derived.steps_per_epoch
        per_example, divisor = steps.step_objective(schedule, epoch, rank, accum)
        t0 = time.perf_counter()
        wait = 0.0
        tokens = 0
        loss_sum = 0.0
        for micro in range(accum):
            batch, chunk = micro_batch(step, micro)
            weights = torch.tensor([schedule.weight(i, rank) for i in chunk], device=device)
            tokens += int(batch["attention_mask"].sum())
            sync = micro == accum - 1
            with sharding.gradient_sync(wrapped, strategy, sync):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                    logits = wrapped(
                        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                    ).logits
                loss = weighted_lm_loss(logits, batch["labels"], weights, per_example) / divisor
                loss.backward()
                if sync and strategy == "ddp":
                    wait = max(0.0, time.perf_counter() - timer.last_ready)
            loss_sum += float(loss.detach())
        if step == start_step:  # the model state each strategy shards, measured once
            totals["state_bytes"] = sharding.state_bytes(wrapped, opt, strategy)
        grad_norm = local_grad_norm(params)
        if any_worker_diverged(loss_sum, grad_norm, device):  # every rank gets the same answer
            diverged_at = step
            totals["diverged"] = {"loss": _json_number(loss_sum), "grad_norm": _json_number(float(grad_norm))}
            break
        if cfg.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
        opt.step()
        if step == start_step:  # optimizer state exists after the first step
            totals["state_bytes"]["optimizer"] = optimizer_state_bytes(opt)
        sched.step()
        opt.zero_grad(set_to_none=True)
        step_s = time.perf_counter() - t0
        row = {
            "step": step,
            "rank": rank,
            "epoch": epoch,
            "loss": loss_sum,
            "lr": sched.get_last_lr()[0],
            "grad_norm": float(grad_norm),
            "step_s": step_s,
            "compute_s": step_s - wait,
            "allreduce_wait_s": wait if strategy == "ddp" else None,
            "tokens": tokens,
            "tokens_per_s": tokens / step_s,
            "peak_mem_mb": peak_memory_mb(device),
        }
        log.write(json.dumps(row) + "\n")
        log.flush()
        tracker.log({f"train/{k}": row[k] for k in TRACKED if row[k] is not None}, step)
        totals["tokens"] += tokens
        totals["compute_s"] += step_s - wait
        totals["wait_s"] += wait
        totals["steps"] += 1
        progress.set_postfix(loss=f"{loss_sum:.3f}")
        progress.update(1)
        done = step + 1
        if (
            cfg.train.checkpoint_every
            and done % cfg.train.checkpoint_every == 0
            and done < derived.total_steps
        ):
            so_far = totals_so_far(time.perf_counter() - t_loop, totals["tokens"], device)
            tracker.flush()  # durable before the checkpoint a killed run would resume from
            save_checkpoint(
                run_dir,
                done,
                sharding.unwrapped(wrapped),
                opt,
                sched,
                rank,
                world_size,
                cfg.train.keep_checkpoints,
                strategy,
                progress={"train_s": carried["train_s"] + so_far[0], "tokens": carried["tokens"] + so_far[1]},
            )
    log.close()
    progress.close()
    tracker.close()
    loop_s = time.perf_counter() - t_loop

    totals.update(
        loop_s=loop_s, startup_s=t_loop - t_start, peak_mem_mb=peak_memory_mb(device), threads=threads
    )
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, totals)
    # Under fsdp the weights are gathered (a collective) to rank 0's CPU first. Every rank knows
    # whether training diverged (the flag was all-reduced), so all skip this collective together.
    full = (
        sharding.full_state_dict(wrapped, trainable_only=cfg.model.lora.enabled)
        if strategy == "fsdp" and diverged_at is None
        else None
    )
    if rank == 0:
        if diverged_at is None:
            save_finetuned(sharding.unwrapped(wrapped), tokenizer, run_dir / "model", state_dict=full)
        this_s = max(g["loop_s"] for g in gathered)
        train_s = carried["train_s"] + this_s
        tok = carried["tokens"] + sum(g["tokens"] for g in gathered)
        step_time = sum(g["compute_s"] + g["wait_s"] for g in gathered)
        atomic_write_json(
            run_dir / "train.json",
            {
                "status": "ok" if diverged_at is None else "diverged",
                "train_s": train_s,
                "train_s_carried": carried["train_s"],
                "startup_s": max(g["startup_s"] for g in gathered),
                "steps_run": gathered[0]["steps"],
                "resumed_from_step": start_step,
                "total_steps": derived.total_steps,
                "tokens": tok,
                "tokens_per_s": tok / train_s if train_s > 0 else None,
                "allreduce_wait_share": (
                    sum(g["wait_s"] for g in gathered) / step_time
                    if step_time > 0 and strategy == "ddp"
                    else None
                ),
                "strategy": strategy,
                "activation_checkpointing": cfg.train.activation_checkpointing,
                "peak_mem_mb": max(g["peak_mem_mb"] for g in gathered),
                "per_worker": gathered,
                "device": str(device.type),
                "bf16": bf16,
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

    run_group(train_worker, world_size, (str(run_dir),), join_size=world_size, master_port=master_port)
    return read_json(run_dir / "train.json")
