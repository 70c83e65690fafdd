"""How a launch's jobs are submitted: the sbatch parameters a cluster profile and a cell's needs
give (`slurm_parameters`, checked as sbatch would read them), the batch script they make, and
the submitit executor of each backend (slurm, local, debug). slurm/launcher.py plans the jobs.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from submitit.local.debug import DebugExecutor, DebugJob

from repro.core.config.builder import check_text
from slurm.profile import ClusterProfile

PROJECT_ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- executors


def slurm_parameters(
    profile: ClusterProfile, world_size: int, job_name: str, dependency: str | None = None
) -> dict[str, Any]:
    """sbatch parameters (submitit's names) for a job of `world_size` tasks, one GPU each."""
    nodes, per_node = profile.nodes_for(world_size)
    setup = list(profile.setup)
    setup += [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(profile.env.items())]
    # The code that launched is the code that runs (this checkout, not another install).
    setup.append(f"export PYTHONPATH={shlex.quote(str(PROJECT_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}")
    extra = dict(profile.sbatch_extra)
    if dependency:
        extra["dependency"] = dependency
    params: dict[str, Any] = {
        "job_name": job_name,
        "partition": profile.partition,
        "account": profile.account,
        "qos": profile.qos,
        "constraint": profile.constraint,
        "nodes": nodes,
        "ntasks_per_node": per_node,
        "cpus_per_task": profile.cpus_per_gpu,
        "time": profile.time_limit_min,
        "array_parallelism": profile.array_parallelism,
        "signal_delay_s": 120,
        "setup": setup,
        # One task failing ends the job (others would wait for it at the next collective).
        "srun_args": [*profile.srun_args, "--kill-on-bad-exit=1"],
        "additional_parameters": extra or None,
    }
    if profile.use_gpus:
        params["gpus_per_node"] = per_node
        if profile.mem_per_gpu_gb:
            params["mem_per_gpu"] = f"{int(profile.mem_per_gpu_gb)}G"
    params = {k: v for k, v in params.items() if v is not None}
    check_sbatch_text(params)
    return params


def check_sbatch_text(params: dict[str, Any], folder: Path | None = None) -> None:
    """ConfigError when a value that submitit writes into the sbatch file (job name, profile
    values, setup lines, the log folder) holds a control character: a newline there would start
    a line of its own, e.g. an extra `#SBATCH` directive. Experiment names and profiles are checked
    when loaded; this is the last check, where the text is used."""

    def texts(value: Any, key: str):
        if isinstance(value, (str, Path)):
            yield key, str(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                yield key, str(k)
                yield from texts(v, f"{key}.{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                yield from texts(v, f"{key}[{i}]")

    for key, text in texts({**params, **({"folder": folder} if folder else {})}, "sbatch"):
        check_text(text, key)


def sbatch_script(
    profile: ClusterProfile,
    world_size: int,
    job_name: str,
    folder: Path,
    dependency: str | None = None,
    python: str | None = None,
) -> str:
    """The sbatch file submitit writes for such a job (what the golden-file test compares)."""
    from submitit.slurm.slurm import _make_sbatch_string

    py = python or shlex.quote(sys.executable)
    check_sbatch_text({}, folder)
    command = " ".join([py, "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(
        command=command, folder=folder, **slurm_parameters(profile, world_size, job_name, dependency)
    )


def make_executor(
    backend: str,
    folder: Path,
    profile: ClusterProfile,
    world_size: int,
    job_name: str,
    dependency: str | None = None,
):
    import submitit

    if backend == "debug":
        return InProcessExecutor(folder)
    if backend == "local":
        ex = submitit.LocalExecutor(folder, max_num_timeout=profile.max_requeues)
        ex.update_parameters(timeout_min=profile.time_limit_min, tasks_per_node=world_size, gpus_per_node=0)
        return ex
    check_sbatch_text({}, folder)
    ex = submitit.SlurmExecutor(folder, max_num_timeout=profile.max_requeues)
    ex.update_parameters(**slurm_parameters(profile, world_size, job_name, dependency))
    return ex


# ----------------------------------------------------------------------------- debug backend


class InProcessJob(DebugJob):
    """A `debug` job without the debugger. submitit's DebugJob.results() calls pdb.post_mortem()
    on any exception of the job (ipdb where $PYTHONBREAKPOINT names it), which leaves a user's
    command waiting at a (Pdb) prompt. This one runs once, in this process, with the environment
    it was submitted with (submitit's job id variable among it), when first asked about; its
    exception is kept and raised by result(), as a failed job's is on the other backends."""

    def __init__(self, folder: Path, submission: Any) -> None:
        super().__init__(folder, submission)
        self._error: Exception | None = None

    def _run(self) -> None:
        if self._submission.done() or self._error is not None:
            return
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.environ)
        try:
            self._submission.result()
        except Exception as e:  # noqa: BLE001 - kept; results() raises it, as any backend's
            self._error = e
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def results(self) -> list[Any]:
        self._check_not_cancelled()
        self._run()
        if self._error is not None:
            raise self._error
        return [self._submission.result()]

    def exception(self) -> Exception | None:  # type: ignore[override]
        self._check_not_cancelled()
        self._run()
        return self._error

    def done(self, force_check: bool = False) -> bool:  # noqa: ARG002 - submitit's signature
        if not self.cancelled:
            self._run()
        return True

    @property
    def state(self) -> str:
        if self.cancelled:
            return "CANCELLED"
        if self._error is not None:
            return "FAILED"
        return "DONE" if self._submission.done() else "QUEUED"


class InProcessExecutor(DebugExecutor):
    """The `debug` backend: submitit's DebugExecutor, its jobs InProcessJob."""

    job_class = InProcessJob

    def _internal_process_submissions(self, delayed_submissions: list[Any]) -> list[Any]:
        return [InProcessJob(self.folder, ds) for ds in delayed_submissions]
