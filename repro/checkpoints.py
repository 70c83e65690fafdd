"""Training checkpoints: one folder `checkpoints/step-NNNNNNN/` per saved step, written under a
temporary name by all ranks together and renamed into place whole, so only complete ones are
found (`latest_checkpoint`). It holds every rank's RNG state, the trainable weights and optimizer
state (ddp: rank 0's; fsdp: every rank's shards under dcp/), the scheduler and meta.json (step,
world size, strategy, and the training seconds and tokens of every attempt so far). repro.trainer
saves and resumes through it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

CKPT_DIR = "checkpoints"


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
    """meta.json of a checkpoint: step, world_size, strategy, and train_s and tokens, the totals
    of every attempt up to this checkpoint."""
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
