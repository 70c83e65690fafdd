"""The run folder's own bookkeeping: one writer at a time (a lock), and every attempt's time.

Lock: `<run_dir>/.lock`, an exclusive `fcntl.flock` held for the whole `run_experiment`; the
file holds the holder's pid, host and start time for the message a second run gets. The kernel
drops the lock when its holder dies (kill -9, a node lost, a SLURM requeue), so a restarted run
never waits for a dead one. Spawned workers and the other ranks of a SLURM/torchrun group take no
lock: their leader (rank 0) holds it for them. On a file system without flock support (some
Lustre mounts) the run goes on unlocked, with a warning.

Attempts: `<run_dir>/stages/attempts.json` = {stage: [attempt, ...]}. A stage that starts
appends {"attempt", "status": "running", "started" (Unix time), "pid", "host"}; when it ends the
entry becomes "done" (or "failed") with `stage_s`. An entry still "running" when the next run
starts (under the lock, so its process is dead) was killed: `close_killed` marks it so and sets

    counted_s  seconds from its start to its last durable progress, the newest file it left
               that a later attempt reuses: features.json for select, a checkpoint's meta.json
               for train; 0 for a stage that keeps nothing (pool, schedule, eval, ...).
    ran_s      at least how long it ran: from its start to the newest file it wrote anywhere
               in the run folder (train_log lines are written every step).
    lost_s     ran_s - counted_s: work the kill threw away, redone by the next attempt.

Timing columns add `counted_s` of killed and failed attempts to the finishing attempt's seconds
(`prior_seconds`), so a resumed run reports about what an uninterrupted one would (plus one
restart), and the lost work is kept visible in the ledger rather than hidden or double-counted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.core import stages
from repro.core.io import atomic_write_json, read_json
from repro.core.log import get_logger
from repro.core.types import read_selection

if TYPE_CHECKING:
    from repro.core.config.schema import ExperimentConfig

LOCK_NAME = ".lock"
LEDGER = Path("stages") / "attempts.json"
UNFINISHED = ("killed", "failed", "interrupted")


class RunStopped(RuntimeError):
    """The run stopped on purpose; the message says why and what to do. `exit_code` for the CLI."""

    exit_code = 2


class RunLocked(RunStopped):
    """Another process holds the run folder."""


logger = get_logger()


def is_leader() -> bool:
    """Whether this process owns the run folder: a plain process, or rank 0 of a group launched
    by torchrun/SLURM (the other ranks only train, and write nothing of the run's own)."""
    from repro.core.distributed import env_rank_world

    env = env_rank_world()
    return env is None or env[0] == 0


# ----------------------------------------------------------------------------- the lock


def _holder(fh: Any) -> str:
    fh.seek(0)
    try:
        h = json.loads(fh.read() or "{}")
    except json.JSONDecodeError:
        h = {}
    if not h:
        return "another process (it has not written its name yet)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.get("started", 0)))
    return f"pid {h.get('pid')} on host {h.get('host')} (since {since})"


@contextlib.contextmanager
def run_lock(run_dir: Path, wait: bool = False, poll_s: float = 1.0) -> Iterator[None]:
    """Hold `<run_dir>/.lock` for the block. Held elsewhere: RunLocked naming the holder, or with
    `wait` poll every `poll_s` seconds until it is free."""
    path = Path(run_dir) / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as fh:
        locked = _acquire(fh, path, wait, poll_s)
        try:
            if locked:
                fh.seek(0)
                fh.truncate()
                fh.write(
                    json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
                )
                fh.flush()
            yield
        finally:
            if locked:
                fh.seek(0)
                fh.truncate()  # a later message never names a finished holder
                fh.flush()
                fcntl.flock(fh, fcntl.LOCK_UN)


def _acquire(fh: Any, path: Path, wait: bool, poll_s: float) -> bool:
    """True once locked; False where the file system has no flock (the run goes on unlocked)."""
    t0 = time.monotonic()
    said = False
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            who = _holder(fh)
            if not wait:
                raise RunLocked(
                    f"run folder {path.parent} is in use by {who}: one run writes a run folder at "
                    f"a time. Wait for it to finish (or pass --wait-lock to wait here); if that "
                    f"process is gone, its lock is gone too ({path})"
                ) from None
            if not said or time.monotonic() - t0 > 600:
                logger.info(f"waiting for {who} to finish with {path.parent}")
                said, t0 = True, time.monotonic()
            time.sleep(poll_s)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            logger.warning(
                f"{path}: the file system does not support flock ({e.strerror}); "
                "running without the run-folder lock, so do not start this run twice"
            )
            return False


# ----------------------------------------------------------------------------- attempts


def _ledger(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    p = Path(run_dir) / LEDGER
    return read_json(p) if p.is_file() else {}


def _save(run_dir: Path, ledger: dict[str, list[dict[str, Any]]]) -> None:
    atomic_write_json(Path(run_dir) / LEDGER, ledger)


def reset(run_dir: Path) -> None:
    """Forget every attempt (--force redoes the whole run)."""
    (Path(run_dir) / LEDGER).unlink(missing_ok=True)


def start(run_dir: Path, stage: str) -> dict[str, Any]:
    """Record that `stage` starts now; returns its entry. A stage redone after it finished (other
    eval settings) starts a fresh list: its old attempts made other outputs."""
    ledger = _ledger(run_dir)
    entries = ledger.setdefault(stage, [])
    if entries and entries[-1]["status"] == "done":
        entries.clear()
    entry = {
        "attempt": len(entries) + 1,
        "status": "running",
        "started": time.time(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    entries.append(entry)
    _save(run_dir, ledger)
    return entry


def finish(run_dir: Path, stage: str, status: str, stage_s: float) -> None:
    """Close this process's running entry of `stage` as "done" or "failed" after `stage_s`."""
    ledger = _ledger(run_dir)
    entries = ledger.get(stage) or []
    if not entries or entries[-1]["status"] != "running":
        return
    e = entries[-1]
    e.update(status=status, stage_s=stage_s, ended=time.time())
    if status != "done":  # what of it a later attempt reuses, as for a killed one
        e["counted_s"], e["progress"] = _durable_progress(Path(run_dir), stage, e["started"])
        e["ran_s"] = stage_s
        e["lost_s"] = max(0.0, stage_s - e["counted_s"])
    _save(run_dir, ledger)


def _durable_files(run_dir: Path, stage: str) -> list[Path]:
    """Files a stage leaves that a later attempt of it reuses (its resumable progress)."""
    if stage == "select":
        return [run_dir / "features.json"]
    if stage == "train":
        return sorted((run_dir / "checkpoints").glob("step-*/meta.json"))
    return []


def _durable_progress(run_dir: Path, stage: str, started: float) -> tuple[float, str | None]:
    """(seconds from `started` to the newest durable file written since, that file) or (0, None)."""
    best: tuple[float, str | None] = (0.0, None)
    for p in _durable_files(run_dir, stage):
        if p.is_file() and (m := p.stat().st_mtime) >= started and m - started > best[0]:
            best = (m - started, str(p.relative_to(run_dir)))
    return best


def _last_activity(run_dir: Path, started: float) -> float:
    """Seconds from `started` to the newest file written under the run folder (0 if none)."""
    newest = started
    skip = {run_dir / LOCK_NAME, run_dir / LEDGER}
    for p in run_dir.rglob("*"):
        try:
            if p not in skip and p.is_file():
                newest = max(newest, p.stat().st_mtime)
        except OSError:  # removed while we looked
            continue
    return newest - started


def close_killed(run_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """Mark every entry still "running" as killed (call with the lock held: its process is dead)
    and set its counted_s, ran_s and lost_s. Returns the (stage, entry) pairs closed."""
    run_dir = Path(run_dir)
    ledger = _ledger(run_dir)
    closed = []
    for stage, entries in ledger.items():
        for e in entries:
            if e["status"] != "running":
                continue
            counted, progress = _durable_progress(run_dir, stage, e["started"])
            ran = max(counted, _last_activity(run_dir, e["started"]))
            e.update(status="killed", counted_s=counted, progress=progress, ran_s=ran, lost_s=ran - counted)
            closed.append((stage, e))
    if closed:
        _save(run_dir, ledger)
        for stage, e in closed:
            logger.info(
                f"{stage}: attempt {e['attempt']} (pid {e['pid']} on {e['host']}) was "
                f"killed after at least {e['ran_s']:.1f}s; {e['counted_s']:.1f}s of it "
                f"kept ({e['progress'] or 'nothing reusable'}), counted in the run's "
                "times"
            )
    return closed


def prior_seconds(run_dir: Path, stage: str) -> float:
    """Seconds of `stage`'s killed and failed attempts that the finishing attempt built on."""
    return sum(e.get("counted_s", 0.0) for e in _ledger(run_dir).get(stage, []) if e["status"] in UNFINISHED)


def attempts(run_dir: Path) -> int:
    """How many times the run was started before it finished: 1 + its killed or failed attempts
    (a run that only skips finished stages adds none)."""
    return 1 + sum(e["status"] in UNFINISHED for entries in _ledger(run_dir).values() for e in entries)


# ----------------------------------------------------------------------------- stage markers


def stage_marker(run_dir: Path, name: str) -> Path:
    """The file whose presence means stage `name` finished (it holds the stage's summary)."""
    return run_dir / "stages" / f"{name}.json"


def stage_done(run_dir: Path, name: str, key: dict[str, Any] | None = None) -> bool:
    """Whether stage `name` finished, and (with `key`) for these settings: its marker holds every
    field of `key` with the same value (e.g. {"eval_hash": ...} for the eval-side stages)."""
    marker = stage_marker(run_dir, name)
    if not marker.is_file():
        return False
    if not key:
        return True
    info = read_json(marker)
    return all(info.get(k) == v for k, v in key.items())


# The run folder is keyed by what changes training (config_hash); these stages also depend on
# the eval settings, so their markers record eval_hash and they are redone when it changes.
EVAL_STAGES = stages.EVAL_STAGES


def stage_key(cfg: ExperimentConfig, name: str) -> dict[str, Any] | None:
    """The settings a stage's marker must match to count as done (None: its marker suffices)."""
    from repro.core.config.schema import eval_hash

    return {"eval_hash": eval_hash(cfg)} if name in EVAL_STAGES else None


def stage_current(cfg: ExperimentConfig, run_dir: Path, name: str) -> bool:
    """Stage `name` of this config's run is done, for this config's settings (what `launch` and
    `status` call a finished cell: `results` current for the eval settings)."""
    return stage_done(run_dir, name, stage_key(cfg, name))


def model_dir_of(run_dir: Path) -> Path:
    return Path(read_json(stage_marker(run_dir, "model"))["model_dir"])


def shared_features_device_s(run_dir: Path) -> float:
    """Device-seconds of a feature pass the run reused from a shared features job (its selection
    says the features were reused, and no earlier attempt of its select stage computed them): the
    pass's seconds x the processes that held devices for it (features.json). 0 otherwise."""
    sel_path, meta_path = run_dir / "selection.json", run_dir / "features.json"
    if not sel_path.is_file() or not meta_path.is_file() or prior_seconds(run_dir, "select") > 0:
        return 0.0
    if not read_selection(sel_path).diagnostics.features_reused:
        return 0.0
    meta = read_json(meta_path)
    return float(meta.get("seconds") or 0.0) * int(meta.get("world_size") or meta.get("workers") or 1)
