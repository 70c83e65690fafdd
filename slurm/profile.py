"""Cluster profiles: one YAML file per cluster says how jobs are asked for there.

A profile holds what differs between clusters and nothing about the experiment: partition,
account, qos, constraint, GPUs per node, CPUs and memory per GPU, the time limit, extra sbatch
options passed through as they are, shell lines that set up the environment in each job, where
the shared output directory is, and the GPU's peak throughput with the model-FLOPs utilization
(MFU) that `launch --dry-run` uses to estimate GPU-hours. `configs/clusters/example.yaml` documents
every key; `configs/clusters/local.yaml` is the one-node test cluster of `slurm/local/start.sh`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError, Range, build, check_numbers, check_texts, read_yaml_file
from repro.core.config.load import resolve_config_path

# The dry run's model-FLOPs utilization when a profile names none: the one figure measured for
# the paper recipe so far (a fraction). Where it came from is printed beside it.
MEASURED_MFU = 0.14
MEASURED_MFU_SOURCE = (
    "measured: one H200, CodeLlama-7B shape, full fine-tuning under ddp, "
    "per-device batch 1 x 1,216 tokens, no accumulation: 3,423 tokens/s = "
    "6 x 6.74e9 x 3,423 / 989 TFLOP/s (issue 13; docs/memory.md). A lower "
    "bound for the recipe's accumulation of 64-128"
)


@dataclass
class GpuSpec:
    name: str = "A100-80GB (bf16)"
    peak_tflops: float = 312.0  # dense bf16 tensor-core peak, TFLOP/s per GPU
    # Model-FLOPs utilization for the GPU-hour estimate (a fraction, not a percent); null: the
    # measured MEASURED_MFU above.
    mfu: float | None = None
    # Memory of one GPU in GiB (nvidia-smi's MiB / 1024: 80 for an A100-80GB); null: not checked.
    # Cells whose memory plan (repro/core/memory.py) needs more are refused by launch without --force.
    memory_gb: float | None = None

    @property
    def mfu_used(self) -> float:
        return MEASURED_MFU if self.mfu is None else self.mfu

    @property
    def mfu_source(self) -> str:
        return MEASURED_MFU_SOURCE if self.mfu is None else "the profile's gpu.mfu (assumed)"


@dataclass
class ClusterProfile:
    name: str = "default"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gpus_per_node: int = 4
    cpus_per_gpu: int = 8
    mem_per_gpu_gb: float | None = None  # None: the partition's default
    time_limit_min: int = 240
    max_requeues: int = 3  # how often a timed-out or preempted job is requeued
    array_parallelism: int = 64  # at most this many tasks of one array run at once
    # The cluster's MaxArraySize (slurm.conf; SLURM's default 1001): an array has at most this
    # many tasks, so a sharded feature pass with more shards goes out as several arrays.
    max_array_size: int = 1001
    # GPUs (tasks) of a shared features job; None: the smallest world size of the cells it serves
    features_gpus: int | None = None
    output_dir: str | None = None  # shared output directory; None: the grid's / config's own
    setup: list[str] = field(default_factory=list)  # shell lines run before the job starts
    env: dict[str, str] = field(default_factory=dict)  # exported in every job
    sbatch_extra: dict[str, Any] = field(default_factory=dict)  # passed to sbatch as --key=value
    srun_args: list[str] = field(default_factory=list)
    gpu: GpuSpec = field(default_factory=GpuSpec)
    # Use gres GPUs at all (False: ask for CPUs only; tests on a cluster without gres).
    use_gpus: bool = True

    def nodes_for(self, world_size: int) -> tuple[int, int]:
        """(nodes, tasks per node) for `world_size` workers, one task (and GPU) each."""
        per = max(1, self.gpus_per_node)
        if world_size <= per:
            return 1, world_size
        if world_size % per:
            raise ConfigError(
                f"world_size {world_size} is not a multiple of the profile "
                f"{self.name!r}'s gpus_per_node {per}: a job must fill whole nodes"
            )
        return world_size // per, per


# Numeric keys of a profile and what they allow (repro/core/config/builder.py's Range); every numeric field
# has an entry (tests/test_integrity_inputs.py checks it, as for the experiment config).
RANGES: dict[str, Range] = {
    "gpus_per_node": Range(1),
    "cpus_per_gpu": Range(1),
    "mem_per_gpu_gb": Range(0, lo_incl=False, note="GB; null: the partition's default"),
    "time_limit_min": Range(1, note="minutes"),
    "max_requeues": Range(0),
    "array_parallelism": Range(1),
    "max_array_size": Range(1, note="tasks per job array: the cluster's MaxArraySize (scontrol show config)"),
    "features_gpus": Range(1, note="null: the smallest world size of its cells"),
    "gpu.peak_tflops": Range(0, lo_incl=False, note="TFLOP/s per GPU"),
    "gpu.mfu": Range(0, 1, lo_incl=False, note="a fraction: write 0.4 for 40%; null: the measured 0.14"),
    "gpu.memory_gb": Range(0, lo_incl=False, note="one GPU's memory in GiB, e.g. 80"),
}
# An env key is exported as `export KEY=...`; an sbatch_extra key becomes `#SBATCH --key=...`.
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def check_profile(prof: ClusterProfile) -> None:
    """Numbers in range; no control characters anywhere (every value can reach the sbatch file,
    where a newline would start a line of its own: an extra #SBATCH directive or command);
    env keys that `export` takes; sbatch_extra keys that are option names, values scalars."""
    check_numbers(prof, RANGES)
    check_texts(prof)
    for k in prof.env:
        if not _ENV_KEY.fullmatch(str(k)):
            raise ConfigError(
                f"env: {k!r} is not a shell variable name (letters, digits and _, not starting with a digit)"
            )
    for k, v in prof.sbatch_extra.items():
        if not _SBATCH_KEY.fullmatch(str(k)):
            raise ConfigError(f"sbatch_extra: {k!r} is not an sbatch option name (e.g. mail-type, exclusive)")
        if not isinstance(v, (str, int, float, bool)):
            raise ConfigError(
                f"sbatch_extra.{k}: expected a single value (string, number or true), got {v!r}"
            )


def load_profile(path: str | Path) -> ClusterProfile:
    """Load and check a profile file, by the experiment config's rules (repro/core/config/builder.py's
    `build`: the same types, Literal and null checks and the same wording); errors name the file
    and the key."""
    p = resolve_config_path(path, "cluster profile")
    data = read_yaml_file(p, "cluster profile", " (see configs/clusters/example.yaml)") or {}
    prof = build(ClusterProfile, data, str(p), check_profile)
    if prof.name == "default":
        prof.name = p.stem
    return prof
