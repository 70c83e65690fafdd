"""Runtime helpers every package may use: seeding and peak memory."""

from __future__ import annotations

import random
import resource

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def gpu_energy_j() -> float | None:
    """The visible GPUs' total energy counters in joules (NVML, via the optional nvidia-ml-py
    package), or None where no GPU reports energy: energy is never estimated."""
    import os

    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = (
            [int(x) for x in visible.split(",") if x.strip()]
            if visible and all(x.strip().isdigit() for x in visible.split(","))
            else list(range(pynvml.nvmlDeviceGetCount()))
        )
        if not ids:
            return None
        mj = sum(
            pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in ids
        )
        return mj / 1000.0
    except Exception:  # NVML missing, or the GPU has no energy counter (before Volta)
        return None
