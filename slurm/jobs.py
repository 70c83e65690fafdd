"""What runs inside a job: one grid cell, or the shared features of one (model, pool).

A job is a submitit `Checkpointable` whose only state is configs (plain mappings) and paths, so
that is all submitit pickles. It runs the same pipeline stages as `cluster-repro run`
(`repro/pipeline.py`), which skip whatever is finished; a requeued job (timeout, preemption)
therefore continues where it stopped, and training resumes from its newest checkpoint.

A job with W tasks (one per GPU; `tasks_per_node` = GPUs) is one torch.distributed group:

    rank 0                               ranks 1..W-1
    stages model, pool, select,          wait for rank 0's "prep done" note
      schedule (single-process)          (or its "prep failed" note: raise)
    ----------------- train: every rank joins the group (MASTER_ADDR/PORT, RANK, WORLD_SIZE)
    ----------------- eval: every rank scores its share of the benchmarks (evals/parallel.py)
    rest of eval, results                return

The distributed variables come from SLURM's (node list, SLURM_PROCID, SLURM_LOCALID, job id; see
`repro.core.distributed.slurm_env`) and are exported as torch's env:// expects them, so a job spanning
several nodes works the same: the master is the first node of the job's node list.
While rank 0 runs the single-process stages the rank variables are hidden from it: a stage that
needs several workers there (features when nothing is shared) spawns them on its own node.

Shared stages: CluSTER's gradient-proxy features depend on the model, the pool and the seed, not
on the ratio or the world size. Cells whose selectors say so get one shared-feature key
(repro/experiments/sharing.py). `FeaturesJob` computes the pool and the features once per key into
`<output_dir>/_shared/features/<key>/` (under a file lock, so two launches of the same key do not
race), then runs the selection of every cell of that key, whose run folders get the shared pool
and features as hard links. Cells wait for it through a SLURM dependency (`afterok`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from submitit.helpers import Checkpointable, DelayedSubmission

from repro.core import stages
from repro.core.config.builder import ConfigError
from repro.core.io import atomic_write_json, read_json
from repro.core.log import get_logger

if TYPE_CHECKING:
    from repro.core.distributed import LaunchEnv

RANK_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
)
SHARED_FILES = (
    "pool.jsonl",
    "heldout.jsonl",
    "stages/pool.json",
    "stages/model.json",
    "features.npy",
    "features.json",
)
POLL_S = 0.5


logger = get_logger("launch")


# ----------------------------------------------------------------------------- environment


def job_identity() -> dict[str, Any]:
    """This task's rank, the job's size and id, from submitit's job environment (any backend)."""
    import submitit

    try:
        env = submitit.JobEnvironment()
    except RuntimeError:  # not inside a submitit job: a plain process
        return {
            "rank": 0,
            "world": 1,
            "local_rank": 0,
            "job_id": str(os.getpid()),
            "restart": 0,
            "hosts": [socket.gethostname()],
        }
    return {
        "rank": env.global_rank,
        "world": env.num_tasks,
        "local_rank": env.local_rank,
        "job_id": str(env.job_id),
        "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
        "hosts": list(env.hostnames),
    }


def export_torch_env(ident: dict[str, Any]) -> LaunchEnv:
    """Export MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK for torch.distributed's env:// init.

    In a SLURM task they come from SLURM's variables (`repro.core.distributed.slurm_env`: the master is
    the first node of the node list, the port derived from the job id, so all tasks agree without
    talking and two jobs on one node differ; MASTER_ADDR/MASTER_PORT win when set). Elsewhere
    (submitit's local executor: one node) from `ident`, the same way. Returns what was exported.
    """
    from repro.core.distributed import LaunchEnv, master_port_for_job, slurm_env  # torch: not at import

    env = slurm_env()
    if env is None:
        env = LaunchEnv(
            ident["rank"],
            ident["world"],
            ident["local_rank"],
            os.environ.get("MASTER_ADDR") or ident["hosts"][0],
            int(os.environ.get("MASTER_PORT") or master_port_for_job(ident["job_id"])),
            "submitit",
        )
    elif (env.rank, env.world_size) != (ident["rank"], ident["world"]):
        raise RuntimeError(
            f"SLURM's variables say rank {env.rank} of {env.world_size}, "
            f"submitit's rank {ident['rank']} of {ident['world']}; they must agree"
        )
    os.environ.update(env.torch_vars())
    return env


def rendezvous_probe(backend: str = "gloo") -> dict[str, Any]:
    """A job that checks a cluster's rendezvous: each task joins the group from SLURM's variables
    (`repro.core.distributed.init_from_env`), all-reduces rank + 1 and gathers every task's node.

    Seconds of work and no GPU needed (gloo), so it can be submitted before a multi-node grid;
    tests/test_slurm_cluster.py runs it on 2 nodes x 4 tasks. Returns what this task saw.
    """
    import torch
    import torch.distributed as dist

    from repro.core.distributed import cuda_device_index, init_from_env

    e = init_from_env(backend)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        total = torch.tensor([float(e.rank + 1)])
        dist.all_reduce(total)
        nodes: list[Any] = [None] * e.world_size
        dist.all_gather_object(nodes, node)
    finally:
        dist.destroy_process_group()
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return {
        "rank": e.rank,
        "world_size": e.world_size,
        "local_rank": e.local_rank,
        "node": node,
        "master_addr": e.master_addr,
        "master_port": e.master_port,
        "source": e.source,
        "sum": float(total.item()),
        "nodes": nodes,
        "cuda_device": cuda_device_index(e.local_rank, len(visible)) if visible else None,
    }


@contextlib.contextmanager
def single_process_env() -> Iterator[None]:
    """Hide the rank variables: code inside runs (or spawns its own workers) as one process."""
    saved = {k: os.environ.pop(k) for k in RANK_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (flock; held until the block ends or the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - t0 > 5 and int(time.monotonic() - t0) % 60 == 0:
                    logger.info(f"waiting for the lock {path}")
                time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Rendezvous:
    """Rank 0 does some work; the other ranks wait for its note (ok, or the error it raised).

    Notes are files under `folder`, named by job id and restart count, so a requeued job does not
    read the notes of its earlier attempt. The folder must be shared by all nodes of the job.
    """

    def __init__(self, folder: Path, ident: dict[str, Any], name: str, timeout_s: float) -> None:
        self.path = folder / f"{ident['job_id']}.{ident['restart']}.{name}.json"
        self.rank = ident["rank"]
        self.timeout_s = timeout_s

    @contextlib.contextmanager
    def rank0(self) -> Iterator[dict[str, Any]]:
        note: dict[str, Any] = {}
        try:
            yield note
        except BaseException as e:
            atomic_write_json(self.path, {"ok": False, "error": f"{type(e).__name__}: {e}"})
            raise
        atomic_write_json(self.path, {"ok": True, **note})

    def wait(self) -> dict[str, Any]:
        t0 = time.monotonic()
        while not self.path.is_file():
            if time.monotonic() - t0 > self.timeout_s:
                raise TimeoutError(
                    f"rank {self.rank}: rank 0 wrote no note {self.path} within {self.timeout_s:.0f} s"
                )
            time.sleep(POLL_S)
        note = read_json(self.path)
        if not note.get("ok"):
            raise RuntimeError(f"rank 0 failed, so rank {self.rank} stops: {note.get('error')}")
        return note


def link_shared(shared: Path, run_dir: Path) -> bool:
    """Give a run folder the shared pool and features (hard links; copies across filesystems).

    Only into a run whose pool stage has not run: a run's own files are never replaced.
    """
    if (run_dir / "stages" / "pool.json").is_file() or not (shared / "features.json").is_file():
        return False
    for name in SHARED_FILES:
        src, dst = shared / name, run_dir / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.link-{os.getpid()}")
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    return True


def write_state(state_dir: Path | None, cell_id: str, **fields: Any) -> None:
    """The cell's last known state for `cluster-repro status` (also where SLURM cannot tell)."""
    if state_dir is None:
        return
    atomic_write_json(
        state_dir / f"{cell_id}.json",
        {"cell": cell_id, "time": time.time(), "host": socket.gethostname(), **fields},
    )


# ----------------------------------------------------------------------------- jobs


class _Requeueable(Checkpointable):
    """On timeout or preemption submitit calls `checkpoint` and requeues what it returns.

    The same job, unchanged: its stages skip what is finished and training resumes from the
    newest checkpoint (`train.checkpoint_every` bounds the redone work).
    """

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        logger.info("timeout or preemption: requeueing; training resumes from its newest checkpoint")
        return DelayedSubmission(self, *args, **kwargs)


class CellJob(_Requeueable):
    """One grid cell: every stage of one experiment, on as many tasks as it has workers."""

    def __init__(
        self,
        cell_id: str,
        config: dict[str, Any],
        match_config: dict[str, Any] | None,
        shared_dir: str | None,
        state_dir: str | None,
        timeout_s: float,
        match_by: str = "kept_count",
        match_label: str | None = None,
    ) -> None:
        self.cell_id = cell_id
        self.config = config
        self.match_config = match_config  # the matched cell's config (its kept count sets ours)
        self.match_by = match_by  # or "compute": its measured cost sets ours
        self.match_label = match_label  # what the compute match's record calls it
        self.shared_dir = shared_dir
        self.state_dir = state_dir
        self.timeout_s = timeout_s

    def resolve(self):  # -> ExperimentConfig
        """The cell's config; a matched cell's at the kept count (or the measured compute) of the
        cell it matches (repro/experiments/matching.py, compute.py), which must have selected (or
        trained) by now."""
        from repro.core.config.load import from_dict
        from repro.experiments.matching import resolve_match

        cfg = from_dict(self.config, source=f"cell {self.cell_id}")
        if self.match_config is None:
            return cfg
        ref = from_dict(self.match_config, source=f"cell {self.cell_id} (matched)")
        by = getattr(self, "match_by", "kept_count")  # a job pickled before compute matching
        label = getattr(self, "match_label", None) or ref.name
        matched = resolve_match(cfg, by, ref, ref.run_dir(), label, f"cell {self.cell_id}")
        if matched is None:
            raise RuntimeError(
                f"cell {self.cell_id}: the cell it matches has no "
                + ("training costs" if by == "compute" else "selection")
                + f" yet (in {ref.run_dir()}); its job must finish first"
            )
        return matched

    def __call__(self) -> dict[str, Any]:
        from repro.core.rundir import stage_marker
        from repro.pipeline import run_experiment

        ident = job_identity()
        state_dir = Path(self.state_dir) if self.state_dir else None
        cfg = self.resolve()
        run_dir = cfg.run_dir()
        multi = ident["world"] > 1
        if multi:
            if ident["world"] != cfg.world_size:
                raise RuntimeError(
                    f"cell {self.cell_id}: {ident['world']} tasks for world_size {cfg.world_size}"
                )
            export_torch_env(ident)
        rdv = Rendezvous(run_dir / "launch", ident, "prep", self.timeout_s)

        def state(name: str, **fields: Any) -> None:  # rank 0 keeps the cell's state file
            if ident["rank"] == 0:
                write_state(
                    state_dir,
                    self.cell_id,
                    state=name,
                    job_id=ident["job_id"],
                    run_dir=str(run_dir),
                    **fields,
                )

        try:
            if ident["rank"] == 0:
                state("running", restart=ident["restart"])
                with rdv.rank0(), single_process_env():
                    if self.shared_dir and link_shared(Path(self.shared_dir), run_dir):
                        logger.info(f"shared pool and features from {self.shared_dir}")
                    run_experiment(cfg, until=stages.SOLO_UNTIL)
            else:
                rdv.wait()
            if multi:  # every rank trains, then scores its share of the benchmarks
                run_experiment(cfg, until=stages.TRAIN_UNTIL)
            if ident["rank"] != 0:
                if multi:  # rank 0's eval stage: evals/parallel.py
                    from repro.pipeline import join_eval_stage

                    join_eval_stage(cfg, run_dir)
                return {"cell": self.cell_id, "rank": ident["rank"]}
            run_experiment(cfg)
        except SystemExit:  # submitit's signal handler after requeueing (timeout, preemption)
            state("requeued", restart=ident["restart"])
            raise
        except BaseException as e:
            state("failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
            raise
        state("done", restart=ident["restart"])
        return {
            "cell": self.cell_id,
            "run_dir": str(run_dir),
            "results": str(read_json(stage_marker(run_dir, "results"))["path"]),
        }


def _feature_model(features: dict[str, Any], cfg: Any, shared: Path) -> tuple[Path, Any]:
    """The model the features come from: the shared folder's target model, or the selector's
    proxy_model (method/features.py feature_model)."""
    from method.features import feature_model
    from repro.core.rundir import model_dir_of

    return feature_model(features.get("proxy_model"), cfg.model, model_dir_of(shared), cfg.seed)


class FeatureShardJob(_Requeueable):
    """Shard `shard` of `shards` of one key's gradient-proxy features (method/feature_shards.py):
    one task of the key's job array, one process on one GPU. The first task to start stages the
    model and the pool in the shared folder (under its lock; the others find them done), then
    every task computes its own shard; a done shard (its marker matches) is skipped, so a
    requeued or resubmitted task recomputes only its own unfinished shard. The key's
    `FeaturesJob` waits for the whole array (afterok), merges and selects."""

    def __init__(
        self,
        key: str,
        shard: int,
        shards: int,
        features: dict[str, Any],
        config: dict[str, Any],
        shared_dir: str,
        state_dir: str | None,
    ) -> None:
        self.key, self.shard, self.shards = key, shard, shards
        self.features = features
        self.config = config
        self.shared_dir = shared_dir
        self.state_dir = state_dir

    def __call__(self) -> dict[str, Any]:
        from method.feature_shards import compute_shard
        from repro.core.config.load import from_dict, save_config
        from repro.pipeline import _stage, stage_model, stage_pool

        cfg = from_dict(self.config, source=f"features {self.key} shard {self.shard}")
        shared = Path(self.shared_dir)
        shared.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with file_lock(shared / ".prep.lock"), single_process_env():
            if not (shared / "config.yaml").is_file():
                save_config(cfg, shared / "config.yaml")
            _stage(shared, "model", False, lambda: stage_model(cfg, shared), record=False)
            _stage(shared, "pool", False, lambda: stage_pool(cfg, shared), record=False)
        with single_process_env():
            model_dir, model_cfg = _feature_model(self.features, cfg, shared)
            computed = compute_shard(
                shared,
                self.shard,
                self.shards,
                model_dir,
                model_cfg,
                cfg.data.max_length,
                int(self.features["feature_batch_size"]),
                feature_max_length=self.features.get("feature_max_length"),
            )
        return {
            "features": self.key,
            "shard": self.shard,
            "computed": computed,
            "seconds": time.perf_counter() - t0,
        }


class FeaturesJob(_Requeueable):
    """The shared features of one key (model, pool, seed and feature pass), then the selection of
    its cells.

    `features` is what the cells' selector said identifies its features (its `feature_key`,
    repro/core/interfaces.py); this job computes the one kind the suite has, CluSTER's
    gradient-proxy features (method/features.py), with the batch size it names.
    """

    def __init__(
        self,
        key: str,
        features: dict[str, Any],
        config: dict[str, Any],
        cells: list[tuple[str, dict[str, Any]]],
        shared_dir: str,
        state_dir: str | None,
        timeout_s: float,
    ) -> None:
        if features.get("features") != "gradient-proxy":
            raise ConfigError(
                f"features {key}: the shared features job computes gradient-proxy "
                f"features only; the selector asked for {features!r}"
            )
        self.key = key
        self.features = features
        self.config = config  # any cell of the key: model, data and seed are what matter
        self.cells = cells  # (cell id, config) of the cells to select for
        self.shared_dir = shared_dir
        self.state_dir = state_dir
        self.timeout_s = timeout_s

    def __call__(self) -> dict[str, Any]:
        from method.features import features_to_file
        from repro.core.config.load import from_dict
        from repro.pipeline import _stage, run_experiment, stage_model, stage_pool

        ident = job_identity()
        cfg = from_dict(self.config, source=f"features {self.key}")
        shared = Path(self.shared_dir)
        world = ident["world"]
        if world > 1:
            export_torch_env(ident)
        rdv = Rendezvous(shared / "launch", ident, "pool", self.timeout_s)
        lock = contextlib.ExitStack()
        t0 = time.perf_counter()
        try:
            if ident["rank"] == 0:
                write_state(
                    Path(self.state_dir) if self.state_dir else None,
                    f"features-{self.key}",
                    state="running",
                    job_id=ident["job_id"],
                )
                lock.enter_context(file_lock(shared / ".lock"))  # held until this job ends
                with rdv.rank0() as note, single_process_env():
                    from repro.core.config.load import save_config

                    save_config(cfg, shared / "config.yaml")
                    _stage(shared, "model", False, lambda: stage_model(cfg, shared))
                    _stage(shared, "pool", False, lambda: stage_pool(cfg, shared))
                    note["compute"] = not (shared / "features.json").is_file()
            note = rdv.wait() if ident["rank"] != 0 else read_json(rdv.path)
            shards = int(cfg.selection.params.get("feature_shards") or 1)
            if note["compute"] and shards > 1:
                if ident["rank"] == 0:  # the array computed the shards; any left over run here
                    from method.feature_shards import sharded_features_to_file

                    with single_process_env():
                        model_dir, model_cfg = _feature_model(self.features, cfg, shared)
                        sharded_features_to_file(
                            shared,
                            shards,
                            model_dir,
                            model_cfg,
                            cfg.data.max_length,
                            int(self.features["feature_batch_size"]),
                            shared / "features.npy",
                            self.features.get("feature_max_length"),
                        )
            elif note["compute"]:
                params = cfg.selection.params
                workers = min(world, int(params.get("feature_workers") or world))  # rest: idle
                model_dir, model_cfg = _feature_model(self.features, cfg, shared)
                features_to_file(
                    shared,
                    workers,
                    model_dir,
                    model_cfg,
                    cfg.data.max_length,
                    int(self.features["feature_batch_size"]),
                    shared / "features.npy",
                    self.features.get("feature_max_length"),
                )
            if ident["rank"] != 0:
                return {"features": self.key, "rank": ident["rank"]}
            with single_process_env():
                for cell_id, data in self.cells:
                    ccfg = from_dict(data, source=f"cell {cell_id}")
                    link_shared(shared, ccfg.run_dir())
                    logger.info(f"selection of {cell_id}")
                    run_experiment(ccfg, until=stages.SOLO_UNTIL)
        except Exception as e:
            if ident["rank"] == 0:
                write_state(
                    Path(self.state_dir) if self.state_dir else None,
                    f"features-{self.key}",
                    state="failed",
                    job_id=ident["job_id"],
                    error=f"{type(e).__name__}: {e}",
                )
            raise
        finally:
            lock.close()
        write_state(
            Path(self.state_dir) if self.state_dir else None,
            f"features-{self.key}",
            state="done",
            job_id=ident["job_id"],
        )
        return {
            "features": self.key,
            "shared_dir": str(shared),
            "cells": [c for c, _ in self.cells],
            "seconds": time.perf_counter() - t0,
        }
