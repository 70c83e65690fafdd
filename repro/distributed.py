"""Starting a torch.distributed process group: spawned locally, or from SLURM/torchrun variables.

Locally, `spawn_workers` starts `world_size` processes with `torch.multiprocessing` (spawn start
method, so each worker imports fresh) on 127.0.0.1 and a free port. Under SLURM or torchrun the
processes already exist: `init_from_env` reads RANK/WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS).
Backend: gloo on CPU, nccl on GPU.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def env_rank_world() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) from torchrun or SLURM variables, or None if not set."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    if "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ:
        return (int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]),
                int(os.environ.get("SLURM_LOCALID", 0)))
    return None


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int,
                       backend: str | None = None) -> None:
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    dist.init_process_group(backend or default_backend(), rank=rank, world_size=world_size)


def set_worker_threads(world_size: int, threads: int | None = None) -> int:
    """Split the machine's cores between workers (oversubscription makes CPU DDP crawl)."""
    n = threads or max(1, (os.cpu_count() or 1) // world_size)
    torch.set_num_threads(n)
    return n


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple) -> None:
    init_process_group(rank, world_size, "127.0.0.1", port)
    try:
        fn(rank, world_size, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn_workers(fn: Callable[..., Any], world_size: int, args: tuple = (),
                  master_port: int | None = None) -> None:
    """Run fn(rank, world_size, *args) in `world_size` fresh processes joined in one group.

    `fn` must live in an importable module (not __main__): spawned children import it by name.
    A worker's exception is re-raised here with its traceback (torch's ProcessRaisedException).
    """
    port = master_port or free_port()
    mp.start_processes(_entry, args=(fn, world_size, port, args), nprocs=world_size,
                       join=True, start_method="spawn")
