"""Submit an experiment file's cells with submitit, and read back where each cell stands.

    launch: plan the cells (repro/experiments/experiment.py) -> drop finished cells -> one
            features job per (model, pool) that CluSTER cells share -> the cells, one job each
            (arrays when several share resources), waiting on their features job through
            `--dependency=afterok` -> jobs.json
    status: each cell's state: done (its results exist, for its eval settings), pending, running,
            failed (with the log path), outdated (results for other eval settings), or not
            launched; SLURM's accounting (sacct) is asked about submitted jobs.

Backends: `slurm` (sbatch through submitit; needs `srun`/`sbatch` and a cluster profile),
`local` (submitit's LocalExecutor: subprocesses on this machine, the same job code and task
layout) and `debug` (in this process, one task; workers are spawned locally). Everything about a
launch lives in `<output_dir>/_launch/<experiment name>/`: `jobs.json` (cell -> job id, log paths),
`state/` (each cell's last state, written by its job), `submitit/` (pickles and logs).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError
from repro.core.config.schema import ExperimentConfig
from repro.core.io import atomic_write_json, read_json
from repro.core.log import get_logger, progress_bar
from repro.experiments.cells import Cell, Experiment
from repro.experiments.experiment import experiment_of
from repro.experiments.matching import resolve_match
from slurm.executors import make_executor
from slurm.jobs import CellJob, FeatureShardJob, FeaturesJob
from slurm.profile import ClusterProfile

BACKENDS = ("slurm", "local", "debug")
PROJECT_ROOT = Path(__file__).resolve().parent.parent
PENDING = {
    "PENDING",
    "REQUEUED",
    "CONFIGURING",
    "RESIZING",
    "SUSPENDED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SPECIAL_EXIT",
}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}


logger = get_logger("launch")


# ----------------------------------------------------------------------------- the context


@dataclass
class Context:
    experiment: Experiment
    cells: list[Cell]
    by_id: dict[str, Cell]
    output_dir: Path
    profile: ClusterProfile
    # Each cell's final config, resolved once per plan (a matched cell's from its reference's
    # selection or costs): every question a launch or status asks of a cell gets one answer.
    resolved: dict[str, ExperimentConfig | None] = field(default_factory=dict)

    @property
    def launch_dir(self) -> Path:
        return self.output_dir / "_launch" / self.experiment.name

    def shared_dir(self, key: str) -> Path:
        return self.output_dir / "_shared" / "features" / key


def load_context(args: Any, profile: ClusterProfile) -> Context:
    """The cells a command's arguments name (repro/experiments/experiment.py add_arguments), with
    one absolute output directory: `args.results`, else the profile's, else the base config's
    (relative paths resolve against the current directory)."""
    experiment, _ = experiment_of(args)
    out = args.results or profile.output_dir or experiment.cells[0].check_config().output_dir
    out_abs = Path(out).expanduser().resolve()
    experiment, cells = experiment_of(args, [f"output_dir={out_abs}"])
    return Context(experiment, cells, {c.id: c for c in experiment.cells}, out_abs, profile)


def cell_config(ctx: Context, cell: Cell) -> ExperimentConfig | None:
    """The final config, or None for a matched cell whose reference has not selected yet (or,
    matched in compute, not trained yet); resolved once per plan (`Context.resolved`)."""
    if cell.id in ctx.resolved:
        return ctx.resolved[cell.id]
    if cell.match_of is None:
        cfg: ExperimentConfig | None = cell.config()
    else:
        ref = ctx.by_id[cell.match_of]
        ref_cfg = cell_config(ctx, ref)
        cfg = (
            None
            if ref_cfg is None
            else resolve_match(
                cell.check_config(),
                cell.match_by,
                ref_cfg,
                ref_cfg.run_dir(),
                str(ref.axes.get("label") or ref.id),
                f"cell {cell.id}",
            )
        )
    ctx.resolved[cell.id] = cfg
    return cfg


def has_marker(ctx: Context, cell: Cell, stage: str) -> bool:
    """The cell's stage is done for its current config: for eval and results, with the cell's
    eval settings (a cell whose benchmarks changed is not done: it re-evaluates, not retrains)."""
    from repro.core.rundir import stage_current

    cfg = cell_config(ctx, cell)
    return cfg is not None and stage_current(cfg, cfg.run_dir(), stage)


def cell_run_status(ctx: Context, cell: Cell):  # noqa: ANN201 (repro.core.store.RunStatus | None)
    """The status of the cell's run folder (repro/core/store.py), or None while its config is
    not known yet (a matched cell before its reference) or it has no folder."""
    from repro.core.store import run_status

    cfg = cell_config(ctx, cell)
    if cfg is None or not cfg.run_dir().is_dir():
        return None
    return run_status(cfg.run_dir())


def is_done(ctx: Context, cell: Cell) -> bool:
    """Finished for its current config and eval settings (a diverged run is never done)."""
    from repro.core.store import DONE

    st = cell_run_status(ctx, cell)
    return st is not None and st.state == DONE and has_marker(ctx, cell, "results")


def is_diverged(ctx: Context, cell: Cell) -> bool:
    from repro.core.store import DIVERGED

    st = cell_run_status(ctx, cell)
    return st is not None and st.state == DIVERGED


def diverged_message(ctx: Context, cell: Cell) -> str:
    st = cell_run_status(ctx, cell)
    cfg = cell_config(ctx, cell)
    return (
        f"{cell.id}: {st.describe() if st else 'diverged'}; not submitted: the same config diverges "
        "again. Change it (e.g. train.lr, train.warmup_steps), or remove its run folder "
        f"{cfg.run_dir() if cfg else ''} to run it again as it is"
    )


def results_outdated(ctx: Context, cell: Cell) -> bool:
    """The cell finished, but its results were made with other eval settings than its config's now."""
    from repro.core.store import DONE

    st = cell_run_status(ctx, cell)
    return st is not None and st.state == DONE and not has_marker(ctx, cell, "results")


# ----------------------------------------------------------------------------- the plan


@dataclass
class PlannedJob:
    kind: str  # "features" or "cell"
    name: str  # features-<key> or the cell id
    tasks: int  # SLURM tasks = GPUs = workers
    job: Any  # the CellJob / FeaturesJob to submit
    after: str | None = None  # the name of the planned job this one waits for
    cells: list[str] = field(default_factory=list)


def plan_jobs(ctx: Context, active: set[str] = frozenset()) -> tuple[list[PlannedJob], list[Cell]]:
    """(jobs to submit, cells already done). A features job is planned for each shared-feature
    key (repro/experiments/sharing.py) that has a cell without its selection; matched cells wait
    for the job that selects their reference (its features job, or its own cell job). Cells in
    `active` (queued or running from an earlier launch) are left alone."""
    timeout_s = ctx.profile.time_limit_min * 60.0
    state_dir = str(ctx.launch_dir / "state")
    done = [c for c in ctx.cells if is_done(ctx, c)]
    diverged = [c for c in ctx.cells if is_diverged(ctx, c)]
    for c in diverged:  # never submitted as if new, never counted as done
        logger.warning(diverged_message(ctx, c))
    todo = [c for c in ctx.cells if c not in done and c not in diverged and c.id not in active]
    keys: dict[str, str | None] = {}  # cell id -> its shared-feature key (None: shares none)

    def key_of(c: Cell) -> str | None:
        if c.id not in keys:
            try:
                keys[c.id] = c.feature_key()
            except ConfigError:  # a selector that cannot be made: preflight names the cell, and
                keys[c.id] = None  # only a dry run plans such a cell (to show the plan anyway)
        return keys[c.id]

    groups: dict[str, list[Cell]] = {}
    for c in todo:
        if key_of(c) is not None and not has_marker(ctx, c, "select"):
            groups.setdefault(key_of(c), []).append(c)
    for c in todo:  # a matched cell's reference must select even when the reference is done
        ref = ctx.by_id.get(c.match_of) if c.match_of else None
        if (
            ref is not None
            and key_of(ref) is not None
            and ref.id not in active
            and not has_marker(ctx, ref, "select")
        ):
            grp = groups.setdefault(key_of(ref), [])
            if ref not in grp:
                grp.append(ref)
    jobs: list[PlannedJob] = []
    feature_of: dict[str, str] = {}
    for key, grp in groups.items():
        tasks = ctx.profile.features_gpus or min(c.axes["world_size"] for c in grp)
        tasks = max(1, min(tasks, ctx.profile.gpus_per_node))
        name = f"features-{key}"
        cfgs = [(c.id, c.config().to_dict()) for c in grp]
        shards = feature_shards(grp[0])
        after_shards = None
        if shards > 1:  # one array task (one GPU) per shard; the features job merges and selects
            after_shards, tasks = f"shards-{key}", 1
            for s in range(shards):
                jobs.append(
                    PlannedJob(
                        "shard",
                        f"shard-{key}-{s:05d}",
                        1,
                        FeatureShardJob(
                            key,
                            s,
                            shards,
                            grp[0].feature_pass(),
                            cfgs[0][1],
                            str(ctx.shared_dir(key)),
                            state_dir,
                        ),
                        cells=[c.id for c in grp],
                    )
                )
        jobs.append(
            PlannedJob(
                "features",
                name,
                tasks,
                FeaturesJob(
                    key,
                    grp[0].feature_pass(),
                    cfgs[0][1],
                    cfgs,
                    str(ctx.shared_dir(key)),
                    state_dir,
                    timeout_s,
                ),
                after=after_shards,
                cells=[c.id for c in grp],
            )
        )
        for c in grp:
            feature_of[c.id] = name
    for c in todo:
        after = feature_of.get(c.id)
        match_cfg = None
        if c.match_of and c.match_by == "compute":  # waits for its reference's training
            ref = ctx.by_id[c.match_of]
            match_cfg = ref.config().to_dict()
            if is_diverged(ctx, ref):
                raise ConfigError(
                    f"cell {c.id} takes the compute of {ref.id}, whose training diverged: a "
                    "diverged run's cost is not a finished run's. Fix that cell first"
                )
            if not has_marker(ctx, ref, "train"):
                after = ref.id if (ref in todo or ref.id in active) else None
                if after is None:
                    raise ConfigError(
                        f"cell {c.id} takes the compute of {ref.id}, which has not trained and "
                        "is not part of this launch; drop --only filters that leave it out"
                    )
        elif c.match_of:
            ref = ctx.by_id[c.match_of]
            match_cfg = ref.config().to_dict()
            if not has_marker(ctx, ref, "select"):
                after = feature_of.get(ref.id) or (ref.id if ref in todo else None)
                if after is None and ref.id in active:  # its reference is queued from before
                    fname = f"features-{key_of(ref)}"
                    after = fname if fname in _record(ctx)["jobs"] else ref.id
                if after is None:
                    raise ConfigError(
                        f"cell {c.id} takes the kept count of {ref.id}, which has no "
                        "selection and is not part of this launch; drop --only "
                        "filters that leave it out"
                    )
        shared = str(ctx.shared_dir(key_of(c))) if key_of(c) is not None else None
        data = c.data if c.match_of else c.config().to_dict()
        jobs.append(
            PlannedJob(
                "cell",
                c.id,
                c.axes["world_size"],
                CellJob(
                    c.id,
                    data,
                    match_cfg,
                    shared,
                    state_dir,
                    timeout_s,
                    c.match_by,
                    str(ctx.by_id[c.match_of].axes.get("label") or c.match_of) if c.match_of else None,
                ),
                after=after,
                cells=[c.id],
            )
        )
    return jobs, done


def feature_shards(cell: Cell) -> int:
    """selection.params.feature_shards of a cell (1: one feature pass, no array)."""
    return int(cell.config().selection.params.get("feature_shards") or 1)


def preflight_cells(ctx: Context, cells: list[Cell]) -> dict[str, list]:
    """ "cell <id>" -> its preflight findings (repro/preflight.py: benchmark, selector and
    allocator names, data files, batches, ratio, the world size against the profile's nodes),
    each checked with this install's registries and the profile's job environment."""
    from repro.preflight import preflight_all
    from repro.problems import CheckContext

    return preflight_all(
        [(f"cell {c.id}", c.check_config()) for c in cells], CheckContext(profile=ctx.profile)
    )


# ----------------------------------------------------------------------------- submitting


def _record(ctx: Context) -> dict[str, Any]:
    path = ctx.launch_dir / "jobs.json"
    return read_json(path) if path.is_file() else {"experiment": str(ctx.experiment.path), "jobs": {}}


def _paths(job: Any) -> tuple[str, str]:
    try:
        return str(job.paths.stdout), str(job.paths.stderr)
    except Exception:  # noqa: BLE001 - the debug executor has no log files
        return "", ""


def waves(jobs: list[PlannedJob]) -> list[list[PlannedJob]]:
    """Features jobs; cells that wait for nothing or for a features job; cells that wait for a
    cell (a matched cell whose reference selects in its own job)."""
    shard = [j for j in jobs if j.kind == "shard"]
    feat = [j for j in jobs if j.kind == "features"]
    first = [j for j in jobs if j.kind == "cell" and (j.after is None or j.after.startswith("features-"))]
    second = [j for j in jobs if j.kind == "cell" and j not in first]
    return [w for w in (shard, feat, first, second) if w]


def bucket(
    wave: list[PlannedJob], max_array_size: int | None = None
) -> list[tuple[int, str | None, list[PlannedJob]]]:
    """Jobs with the same task count and dependency: one sbatch submission (an array if > 1),
    cut into arrays of at most `max_array_size` tasks (the profile's max_array_size, the
    cluster's MaxArraySize)."""
    out: dict[tuple[int, str | None], list[PlannedJob]] = {}
    for pj in wave:
        out.setdefault((pj.tasks, pj.after), []).append(pj)
    size = max_array_size or max(1, len(wave))
    return [(t, a, grp[i : i + size]) for (t, a), grp in out.items() for i in range(0, len(grp), size)]


def submit(ctx: Context, jobs: list[PlannedJob], backend: str) -> dict[str, Any]:
    """Submit the planned jobs; features jobs first. Returns name -> submitit job.

    On SLURM, cells wait for their features job through `afterok` dependencies and cells with the
    same task count and dependency go out as one job array. Locally (no scheduler), the features
    jobs are waited for before their cells are submitted.
    """
    folder = ctx.launch_dir / "submitit"
    folder.mkdir(parents=True, exist_ok=True)
    (ctx.launch_dir / "state").mkdir(parents=True, exist_ok=True)
    record = _record(ctx)
    record.update(backend=backend, output_dir=str(ctx.output_dir), folder=str(folder))
    submitted: dict[str, Any] = {}

    def note(pj: PlannedJob, job: Any, after_id: str | None) -> None:
        out, err = _paths(job)
        submitted[pj.name] = job
        record["jobs"][pj.name] = {
            "kind": pj.kind,
            "job_id": str(job.job_id),
            "tasks": pj.tasks,
            "cells": pj.cells,
            "after": after_id,
            "stdout": out,
            "stderr": err,
            "submitted_at": time.time(),
        }

    for wave in waves(jobs):
        for tasks, after, group in bucket(wave, ctx.profile.max_array_size):
            after_id = None
            if after is not None and after.startswith("shards-"):  # every task of a key's array(s)
                prefix = "shard-" + after[len("shards-") :] + "-"
                deps = [(n, j) for n, j in submitted.items() if n.startswith(prefix)]
                ids = {str(j.job_id).split("_")[0] for _, j in deps}
                after_id = ":".join(sorted(ids)) or None
                if backend != "slurm":
                    for n, j in deps:
                        _wait_ok(j, n)
            elif after is not None:
                dep = submitted.get(after)
                after_id = (
                    str(dep.job_id) if dep is not None else record["jobs"].get(after, {}).get("job_id")
                )  # from an earlier launch
                if backend != "slurm" and dep is not None:
                    _wait_ok(dep, after)
            name = (
                f"{ctx.experiment.name}:{group[0].name}"
                if len(group) == 1
                else f"{ctx.experiment.name}:{len(group)}x{group[0].kind}"
            )
            ex = make_executor(
                backend,
                folder,
                ctx.profile,
                tasks,
                name,
                f"afterok:{after_id}" if backend == "slurm" and after_id else None,
            )
            if len(group) == 1:
                js = [ex.submit(group[0].job)]
            else:
                with ex.batch():
                    js = [ex.submit(pj.job) for pj in group]
            for pj, job in zip(group, js):
                note(pj, job, after_id)
                logger.info(
                    f"{pj.kind} {pj.name}: job {job.job_id}" + (f" (after {after_id})" if after_id else "")
                )
            atomic_write_json(ctx.launch_dir / "jobs.json", record)  # after every submission
    return submitted


def _wait_ok(job: Any, name: str) -> None:
    try:
        job.result()
    except Exception as e:  # noqa: BLE001 - reported with the job's name, then raised
        raise RuntimeError(
            f"{name} (job {job.job_id}) failed, so the cells that need it were not submitted: {e}"
        ) from e


def wait_all(submitted: dict[str, Any], poll_s: float = 2.0) -> dict[str, str]:
    """Block until every job has ended; name -> "done" or "failed: <reason>"."""
    left = dict(submitted)
    out: dict[str, str] = {}
    rounds = 0
    bar = progress_bar(total=len(left), desc="jobs ended", unit="job", logger=logger)
    while left:
        rounds += 1
        # One sacct call every few rounds refreshes every job's state (submitit's watcher is
        # shared by all jobs); otherwise a job that died without a result is noticed only after
        # minutes, as the watcher's own refresh interval grows with the jobs' age.
        import submitit

        first = next(iter(left.values()))
        if isinstance(first, submitit.SlurmJob) and rounds % 3 == 0:
            first.watcher.update()
        for name, job in list(left.items()):
            if job.done():
                try:
                    job.results()
                    out[name] = "done"
                except Exception as e:  # noqa: BLE001 - a failed job is reported, not raised
                    out[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                del left[name]
                bar.set_postfix(failed=sum(v != "done" for v in out.values()))
                bar.update(1)
        if left:
            time.sleep(poll_s)
    bar.close()
    return out


# ----------------------------------------------------------------------------- status


def slurm_states(job_ids: list[str]) -> dict[str, str]:
    """job id -> SLURM state word, from sacct (accounting), then squeue for jobs sacct lacks.

    Array tasks are ids like 123_4; a pending array shows up as 123_[0-7], which submitit's
    parser expands.
    """
    from submitit.slurm.slurm import SlurmInfoWatcher

    def ask(cmd: list[str], header: str = "") -> dict[str, dict[str, str]]:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        return SlurmInfoWatcher().read_info(header + p.stdout) if p.returncode == 0 else {}

    if not job_ids:
        return {}
    bases = sorted({j.split("_")[0] for j in job_ids})
    info = ask(["sacct", "-o", "JobID,State,NodeList", "--parsable2", *[x for b in bases for x in ("-j", b)]])
    missing = sorted({j.split("_")[0] for j in job_ids if j not in info})
    if missing:
        queued = ask(
            ["squeue", "-h", "-o", "%i|%T|%N", "-j", ",".join(missing)], header="JobID|State|NodeList\n"
        )
        info = {**queued, **info}
    return {j: info[j]["State"].split()[0] for j in job_ids if info.get(j, {}).get("State")}


@dataclass
class CellStatus:
    cell: str
    # done, diverged, pending, running, failed, outdated (other eval settings), not launched
    state: str
    job_id: str | None
    log: str | None
    detail: str = ""


def cell_statuses(ctx: Context) -> list[CellStatus]:
    record = _record(ctx)
    jobs = record.get("jobs", {})
    backend = record.get("backend")
    ids = [j["job_id"] for j in jobs.values()]
    live = slurm_states(ids) if backend == "slurm" else {}
    by_job_id = {j["job_id"]: (name, j) for name, j in jobs.items()}
    out = []
    for c in ctx.cells:
        j = jobs.get(c.id)
        st_file = ctx.launch_dir / "state" / f"{c.id}.json"
        note = read_json(st_file) if st_file.is_file() else {}
        st = cell_run_status(ctx, c)
        if is_done(ctx, c):
            cfg = cell_config(ctx, c)
            out.append(CellStatus(c.id, "done", j and j["job_id"], str(cfg.run_dir()) if cfg else None))
            continue
        if st is not None and st.state == "diverged":  # finished, with no result: said so
            cfg = cell_config(ctx, c)
            out.append(
                CellStatus(
                    c.id, "diverged", j and j["job_id"], str(cfg.run_dir()) if cfg else None, st.detail
                )
            )
            continue
        if j is None:  # not launched from here: its run folder may still say where it stands
            cfg = cell_config(ctx, c)
            if st is not None and st.state in ("failed", "incomplete") and cfg is not None:
                out.append(CellStatus(c.id, st.state, None, str(cfg.run_dir()), st.detail))
            else:
                out.append(CellStatus(c.id, "not launched", None, None))
            continue
        log = j.get("stderr") or None
        if note.get("job_id") != j["job_id"]:  # written by an earlier launch's job
            note = {}
        sl = live.get(j["job_id"])
        if sl in PENDING:
            out.append(CellStatus(c.id, "pending", j["job_id"], log, sl))
        elif sl in RUNNING:
            out.append(CellStatus(c.id, "running", j["job_id"], log, sl))
        elif (sl == "COMPLETED" or (sl is None and note.get("state") == "done")) and results_outdated(ctx, c):
            # Its job finished, but the eval settings changed since: a launch re-evaluates it.
            out.append(
                CellStatus(
                    c.id,
                    "outdated",
                    j["job_id"],
                    log,
                    "results made with other eval settings; launch again to re-evaluate (no retraining)",
                )
            )
        elif sl is not None:  # ended without results: FAILED, CANCELLED, TIMEOUT, COMPLETED...
            why = sl + (f"; rank 0 said: {note['error']}" if note.get("error") else "")
            dep = by_job_id.get(str(j.get("after")))
            if dep is not None and live.get(dep[1]["job_id"]) not in (None, "COMPLETED", *PENDING, *RUNNING):
                why += (
                    f"; it waited for {dep[0]} (job {dep[1]['job_id']}), which ended "
                    f"{live.get(dep[1]['job_id'])}: see {dep[1].get('stderr')}"
                )
            out.append(CellStatus(c.id, "failed", j["job_id"], log, why))
        elif note.get("state") == "failed":
            out.append(CellStatus(c.id, "failed", j["job_id"], log, note.get("error", "")))
        elif note.get("state") == "running":
            out.append(CellStatus(c.id, "running", j["job_id"], log))
        else:
            out.append(
                CellStatus(
                    c.id, "pending", j["job_id"], log, "no scheduler state yet" if backend == "slurm" else ""
                )
            )
    return out
