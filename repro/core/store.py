"""The results store: run folders, their status and their measurements, read one way by every
command that reads results (report, claims, status, launch, results, the matchers, the analyses).

Identity (docs/files.md, "The results store"):

- A **run** is one run folder `<root>/<name>/<config_hash>/` and its record `run.json`: the
  folder's schema version, its run id and config hash (with the version of the defaults the hash
  was made under: a run of another is refused, `other_hash_version`), and its stored config.
  Which cell of a table a run belongs to is decided from its stored config (reports/load.py),
  never from the columns of a result row.
- A **measurement** is (run, eval identity, protocol, benchmark, metric). The eval identity
  (`eval_id`, a result column) names the settings an evaluation ran with: the pipeline's eval
  stage (the config's eval_hash) or one `cluster-repro eval --run`, which writes into a folder
  of its own, `<run>/evals/<eval_id>/`. So several evaluations, and several protocols, coexist in
  one run, and every reader picks rows by that key.
- A run's **status** comes from its stage markers (`run_status`): done, diverged, failed or
  incomplete. A diverged run is never read as a result or a cost, nor skipped as done.
- A model evaluated alone (`cluster-repro eval --model`) is a run of kind "model-eval": its
  folder holds `model-eval.json` (the model it scored) instead of a config.

Versions: every results file this suite writes, every run folder and every merged set carries
`schema.VERSION`. A reader meets an older one only through `check_version` and friends below,
which refuse it with the command that rebuilds it (`cluster-repro results --migrate DIR`,
repro/migrate.py): no reader keeps a branch for older files.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core import schema
from repro.core.errors import UserError
from repro.core.io import atomic_write_json, read_json
from repro.core.results import (
    PART_NAME,
    ConflictingRowsError,
    DamagedResultFile,
    DamagedResultsError,
    check_output_set,
    damaged_message,
    read_checked,
    sidecar_path,
)

# In a run folder: {"schema", "run_id", "config_hash", "config_hash_version", "name", "config"}.
RUN_RECORD = "run.json"
EVAL_RECORD = "model-eval.json"  # in a model evaluation's folder: {"schema", "run_id", "model", ...}
EVALS_DIR = "evals"  # <run>/evals/<eval_id>/: one `cluster-repro eval --run` each
RUNS_INDEX = "runs.jsonl"  # in a merged set: one line per run (its record, config and status)
# Folders under a results root that hold no runs (launch records, shared feature passes).
NOT_RUNS = ("_launch", "_shared")

DONE, DIVERGED, FAILED, INCOMPLETE = "done", "diverged", "failed", "incomplete"
STATES = (DONE, DIVERGED, FAILED, INCOMPLETE)
RUN, MODEL_EVAL = "run", "model-eval"
# The `written_by` column: the run's results stage, or a `cluster-repro eval` of it.
WRITTEN_BY_RESULTS, WRITTEN_BY_EVAL = "results", "eval"

Row = tuple[str, dict[str, str]]  # ('<file>:<line>', the row as text)


class StoreError(UserError, ValueError):
    """A results store that cannot be read as it is: the message names the file and the fix."""


class OldSchemaError(StoreError):
    """Files of an older version of the suite: the message names each and the command."""


def migrate_command(root: Path | str) -> str:
    return f"cluster-repro results --migrate {root}"


# ----------------------------------------------------------------------------- a run's settings


def dataset_label(cfg: Any) -> str:
    """What the tables call a config's training data: its sources' file stems joined by '+'."""
    return "+".join(Path(s.path).stem for s in cfg.data.sources)


def selection_ratio(cfg: Any) -> float | None:
    """The selector's `ratio` parameter as it runs with it (its default where the config leaves
    it out: CluSTER's r in percent), or None for a selector without one."""
    from repro.core.config.builder import ConfigError
    from repro.core.params import build_params
    from repro.core.registry import SELECTORS

    params = cfg.selection.params
    try:
        p_cls = SELECTORS.params_class(cfg.selection.method)
        value = getattr(build_params(p_cls, params, "selection.params"), "ratio", None)
    except ConfigError:  # a selector not installed here: the params as written
        value = params.get("ratio")
    return None if value is None else float(value)


def run_settings(cfg: Any) -> dict[str, Any]:
    """The run's settings as result columns, from its config: what every result row of the run
    states and what the reports place it by (reports/load.py reads the same from the stored
    config, never from a row)."""
    from repro.core.config.schema import canonical_params

    sel_params, alloc_params = canonical_params(cfg)
    return {
        "run_id": f"{cfg.name}-{cfg.hash()}",
        "config_hash": cfg.hash(),
        "name": cfg.name,
        "method": cfg.selection.method,
        # selection.params and allocation.params in their canonical form (typed, defaults left
        # out: repro/core/params.py), as the config hash takes them: two spellings of one
        # setting are one.
        "selection_params": sel_params,
        "allocator": cfg.allocation.method,
        "allocation_params": alloc_params,
        "weight_mode": cfg.allocation.weight_mode,
        "ratio": selection_ratio(cfg),
        # how the budget was matched to another run (repro/experiments/matching.py, compute.py)
        "matched": cfg.selection.matched,
        "model": cfg.model.name_or_path,
        "dataset": dataset_label(cfg),
        "world_size": cfg.world_size,
        "seed": cfg.seed,
        "selection_seed": cfg.seed_for_selection(),
        "training_seed": cfg.seed_for_training(),
    }


# ----------------------------------------------------------------------------- run status


@dataclass(frozen=True)
class RunStatus:
    """Where a run stands. state: done (every stage finished), diverged (training stopped on a
    non-finite loss or gradient norm; its rows say so), failed (a stage raised; `stage` names
    it), incomplete (not finished: never started, killed, or running now)."""

    state: str
    detail: str = ""
    stage: str | None = None  # failed / incomplete: the first stage not finished
    diverged_step: int | None = None
    total_steps: int | None = None
    eval_hash: str | None = None  # done: the eval settings its results were made with

    @property
    def usable(self) -> bool:
        """Whether its measurements and costs may be read as a finished run's."""
        return self.state == DONE

    def describe(self) -> str:
        return self.state + (f" ({self.detail})" if self.detail else "")


def _marker(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / "stages" / f"{stage}.json"


def _read_marker(run_dir: Path, stage: str) -> dict[str, Any] | None:
    path = _marker(run_dir, stage)
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except (OSError, ValueError) as e:
        raise StoreError(
            f"{path}: unreadable stage marker ({type(e).__name__}: {e}); rerun the run"
        ) from None
    if not isinstance(data, dict):
        raise StoreError(f"{path}: expected a JSON mapping (a stage marker), got {type(data).__name__}")
    return data


def run_status(run_dir: Path) -> RunStatus:
    """The run's status from its stage markers and its attempts ledger (repro/core/rundir.py)."""
    from repro.core import stages

    run_dir = Path(run_dir)
    train = _read_marker(run_dir, "train")
    if train is not None and train.get("status") == "diverged":
        step, total = train.get("diverged_step"), train.get("total_steps")
        return RunStatus(
            DIVERGED,
            f"training diverged at step {step} of {total}",
            diverged_step=None if step is None else int(step),
            total_steps=None if total is None else int(total),
        )
    results = _read_marker(run_dir, "results")
    if results is not None:
        return RunStatus(DONE, eval_hash=results.get("eval_hash"))
    first = next((s for s in stages.NAMES if not _marker(run_dir, s).is_file()), "results")
    ledger_path = run_dir / "stages" / "attempts.json"
    entries: list[dict[str, Any]] = []
    if ledger_path.is_file():
        try:
            entries = (read_json(ledger_path) or {}).get(first) or []
        except (OSError, ValueError, AttributeError):
            entries = []
    last = entries[-1] if entries else None
    if last is not None and last.get("status") == "failed":
        return RunStatus(FAILED, f"stage {first} failed (attempt {last.get('attempt')})", stage=first)
    holder = _lock_holder(run_dir)
    if holder:
        return RunStatus(INCOMPLETE, f"running now ({holder}), at stage {first}", stage=first)
    if last is not None:
        return RunStatus(
            INCOMPLETE, f"stage {first} was {last.get('status')}; run it again to resume", stage=first
        )
    done = [s for s in stages.NAMES if _marker(run_dir, s).is_file()]
    return RunStatus(INCOMPLETE, f"stopped after stage {done[-1]}" if done else "not started", stage=first)


def _lock_holder(run_dir: Path) -> str:
    """'pid P on host H' while a process holds the run folder's lock (it writes its name into the
    lock file while it holds it and empties it when done), else ''."""
    path = run_dir / ".lock"
    try:
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        h = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return ""
    if not h:
        return ""
    import fcntl

    try:  # a holder that died leaves its name: the lock itself says whether it lives
        with open(path, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
        return ""
    except BlockingIOError:
        return f"pid {h.get('pid')} on host {h.get('host')}"
    except OSError:
        return ""


# ----------------------------------------------------------------------------- records and versions


def run_record(cfg: Any) -> dict[str, Any]:
    """A run's record: its schema version, its identity (run id, config hash and the version of
    the defaults it was made under, name) and its config as it runs (what the store places it
    by; config.yaml beside it is the same config for people)."""
    from repro.core.config.schema import CONFIG_HASH_VERSION

    return {
        "schema": schema.VERSION,
        "run_id": f"{cfg.name}-{cfg.hash()}",
        "config_hash": cfg.hash(),
        "config_hash_version": CONFIG_HASH_VERSION,
        "name": cfg.name,
        "config": cfg.to_dict(),
    }


def write_run_record(run_dir: Path, cfg: Any) -> None:
    """The run folder's record (`run_record`), written when the run starts."""
    path = Path(run_dir) / RUN_RECORD
    record = run_record(cfg)
    if path.is_file():
        try:
            if read_json(path) == record:
                return
        except (OSError, ValueError):
            pass
    atomic_write_json(path, record)


def write_eval_record(folder: Path, run_id: str, record: dict[str, Any]) -> None:
    """A model evaluation's record (`cluster-repro eval --model`): what it scored."""
    atomic_write_json(Path(folder) / EVAL_RECORD, {"schema": schema.VERSION, "run_id": run_id, **record})


def _record(path: Path, what: str, root: Path) -> dict[str, Any]:
    """A run or eval record, its schema checked (OldSchemaError for another version)."""
    try:
        rec = read_json(path)
    except (OSError, ValueError) as e:
        raise StoreError(f"{path}: unreadable {what} ({type(e).__name__}); {migrate_command(root)}") from None
    if not isinstance(rec, dict) or rec.get("schema") != schema.VERSION:
        found = rec.get("schema") if isinstance(rec, dict) else None
        raise OldSchemaError(
            f"{path}: {what} of schema version {found}, this suite reads {schema.VERSION}; "
            f"rebuild it with `{migrate_command(root)}`"
        )
    return rec


def other_hash_version(record: dict[str, Any]) -> str | None:
    """What a run record says of its config hash version where it is not this suite's (None:
    it is this one's). Its hash, and so its folder's name and run id, were made under other
    defaults (repro/core/config/schema.py CONFIG_HASH_VERSION): its config hashes otherwise here."""
    from repro.core.config.schema import CONFIG_HASH_VERSION

    found = record.get("config_hash_version")
    if found == CONFIG_HASH_VERSION:
        return None
    return "its record states no config hash version" if found is None else f"config hash version {found}"


def _listed(names: list[str], most: int = 20) -> str:
    """One indented line per name, the first `most` of them, then how many more."""
    more = f"\n  ... and {len(names) - most} more" if len(names) > most else ""
    return "\n".join(f"  {x}" for x in names[:most]) + more


def other_hash_message(folders: list[str], root: Path | str) -> str:
    """The refusal of runs whose config hash is of another version: `folders` names each."""
    from repro.core.config.schema import CONFIG_HASH_VERSION

    lines = _listed(folders)
    return (
        f"{len(folders)} run(s) under {root} are named by the config hash of another version of the "
        f"suite (this one hashes by version {CONFIG_HASH_VERSION}): their configs hash otherwise "
        f"here, so their rows cannot be placed as this version's runs:\n{lines}\nRerun each "
        "(`cluster-repro run <folder>/config.yaml`: it trains into the folder its config names "
        f"now) and move the old folders out of {root}; `cluster-repro results --migrate` cannot "
        "rename a run"
    )


def _states_no_schema(part: Path) -> bool:
    """Its checksum file is readable and states no schema: written by an older version. (An
    unreadable or missing one is damage, which reading the part reports.)"""
    try:
        meta = read_json(sidecar_path(part))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "schema" not in meta


def part_schema(path: Path) -> int | None:
    """The schema version its checksum sidecar states (None: none stated, an older file)."""
    side = sidecar_path(path)
    try:
        meta = read_json(side)
    except (OSError, ValueError):
        return None
    return meta.get("schema") if isinstance(meta, dict) else None


# ----------------------------------------------------------------------------- the store


@dataclass
class StoredRun:
    """One run of the store: its identity, stored config (kind run) or eval record (kind
    model-eval), its status and every row it holds (training rows and its evaluations')."""

    run_id: str
    kind: str
    status: RunStatus
    config: dict[str, Any] | None = None  # the stored config (kind run)
    record: dict[str, Any] = field(default_factory=dict)  # run.json / model-eval.json
    folder: Path | None = None  # None when read from a merged set without its folders
    rows: list[Row] = field(default_factory=list)

    @property
    def config_hash(self) -> str:
        return str(self.record.get("config_hash") or "")

    @property
    def name(self) -> str:
        return str(self.record.get("name") or "")

    def training_rows(self) -> list[Row]:
        """The rows its own results stage wrote (written_by "results"): its settings, costs and
        the pipeline eval's scores; `rows` adds those of every `cluster-repro eval` of it."""
        return [(w, r) for w, r in self.rows if r.get("written_by") == WRITTEN_BY_RESULTS]

    def index_entry(self) -> dict[str, Any]:
        """Its line in a merged set's runs.jsonl."""
        st = self.status
        return {
            "schema": schema.VERSION,
            "run_id": self.run_id,
            "kind": self.kind,
            "record": self.record,
            "config": self.config,
            "status": {
                "state": st.state,
                "detail": st.detail,
                "stage": st.stage,
                "diverged_step": st.diverged_step,
                "total_steps": st.total_steps,
                "eval_hash": st.eval_hash,
            },
            "folder": None if self.folder is None else str(self.folder),
        }


def measurement_key(row: dict[str, str]) -> tuple[str, str, str, str, str]:
    """(run_id, eval_id, protocol, benchmark, metric): what one measurement is."""
    return (
        row["run_id"],
        row.get("eval_id") or "",
        row.get("eval_protocol") or "",
        row["benchmark"],
        row["metric"],
    )


@dataclass
class Store:
    """Every run under a results root (or of one merged set), with their rows and status."""

    root: Path
    runs: dict[str, StoredRun]
    damaged: list[DamagedResultFile] = field(default_factory=list)
    # The files read (part files, or the merged CSV): what a report says it was built from.
    files: list[Path] = field(default_factory=list)

    def rows(self) -> list[Row]:
        return [row for run in self.runs.values() for row in run.rows]

    def by_state(self, *states: str) -> list[StoredRun]:
        return [r for r in self.runs.values() if r.status.state in states]

    def only(self, run_ids: set[str] | None) -> Store:
        """The store restricted to `run_ids` (None: all); StoreError when none of them is here."""
        if run_ids is None:
            return self
        kept = {k: v for k, v in self.runs.items() if k in run_ids}
        if not kept:
            raise StoreError(f"none of the runs {sorted(run_ids)} is in {self.root}")
        return Store(self.root, kept, self.damaged, self.files)


def open_store(path: Path | str, allow_damaged: bool = False) -> Store:
    """The store at `path`: a results folder (its run folders and their part files) or a merged
    results CSV (with its set's runs.jsonl). Every file is checked as it is read (checksums,
    versions); a damaged part is a DamagedResultsError naming each unless `allow_damaged` (then
    it is left out and listed in `Store.damaged`)."""
    path = Path(path)
    if path.is_file():
        return _open_merged(path, allow_damaged)
    if not path.is_dir():
        raise FileNotFoundError(
            f"results {path}: no such file or folder (give the output_dir the runs wrote to, or a "
            "merged results.csv)"
        )
    folders, model_evals, parts, old = _scan(path)
    if not folders and not model_evals and not parts:
        merged = path / "results.csv"
        if merged.is_file():
            return _open_merged(merged, allow_damaged)
        if not old:
            raise FileNotFoundError(
                f"no run folders and no results.csv under {path}; run an experiment first "
                "(cluster-repro run CONFIG, or cluster-repro demo)"
            )
    if old:
        raise OldSchemaError(_old_message(old, path))
    return _open_folder(path, folders, model_evals, parts, allow_damaged)


def _scan(root: Path) -> tuple[list[Path], list[Path], list[Path], list[str]]:
    """(run folders, model-eval folders, part files, findings of older versions) under root."""
    folders: list[Path] = []
    model_evals: list[Path] = []
    old: list[str] = []
    old_folders: set[Path] = set()
    for cfg in sorted(root.rglob("config.yaml")):
        d = cfg.parent
        if _skipped(d, root) or not (d / "stages").is_dir():
            continue
        if not (d / RUN_RECORD).is_file():
            old.append(f"{d}: a run folder without {RUN_RECORD} (written by an older version)")
            old_folders.add(d)
            continue
        folders.append(d)
    for rec in sorted(root.rglob(EVAL_RECORD)):
        if not _skipped(rec.parent, root):
            model_evals.append(rec.parent)
    run_set = set(folders) | set(model_evals)
    parts = []
    for part in sorted(root.rglob(PART_NAME)):
        d = part.parent
        if _skipped(d, root):
            continue
        owner = _owner(d, run_set)
        if owner is None and _owner(d, old_folders) is not None:
            continue  # the folder is named as older already
        if owner is None:
            if d.name == "eval-cli" or (d.parent.name == "eval" and not (d / EVAL_RECORD).is_file()):
                old.append(
                    f"{part}: an evaluation written by an older version (rows without an eval "
                    "identity); move it away and evaluate again with `cluster-repro eval` "
                    "(its settings are in the lm_eval_results.json beside it)"
                )
            elif not any(str(x).startswith(str(d)) for x in run_set):
                raise StoreError(
                    f"{part}: a results file in no run folder (no {RUN_RECORD} or {EVAL_RECORD} "
                    f"at {d} or above it within {root}); move it into its run folder or out of "
                    "the results folder"
                )
            continue
        if _states_no_schema(part):
            old.append(f"{part}: a results file of an older version (its checksum file states no schema)")
            continue
        parts.append(part)
    return folders, model_evals, parts, old


def _skipped(d: Path, root: Path) -> bool:
    rel = d.relative_to(root).parts if d != root else ()
    return any(p in NOT_RUNS or p.startswith(".") for p in rel)


def _owner(d: Path, runs: set[Path]) -> Path | None:
    """The run folder a part in folder `d` belongs to: `d` itself, or the run of `d` =
    `<run>/evals/<eval_id>`."""
    if d in runs:
        return d
    if d.parent.name == EVALS_DIR and d.parent.parent in runs:
        return d.parent.parent
    return None


def _old_message(old: list[str], root: Path) -> str:
    lines = _listed(old)
    return (
        f"{len(old)} file(s) under {root} were written by an older version of the suite (this one "
        f"reads schema version {schema.VERSION}):\n{lines}\nRebuild the run folders' results with "
        f"`{migrate_command(root)}` (no retraining; it says what it cannot rebuild)"
    )


def _open_folder(
    root: Path, folders: list[Path], model_evals: list[Path], parts: list[Path], allow_damaged: bool
) -> Store:
    runs: dict[str, StoredRun] = {}
    where: dict[str, Path] = {}
    other_hash: list[str] = []
    for d in folders:
        rec = _record(d / RUN_RECORD, "run record", root)
        run_id = str(rec.get("run_id") or "")
        if not run_id:
            raise StoreError(f"{d / RUN_RECORD}: no run_id; {migrate_command(root)}")
        if run_id in runs:
            raise StoreError(
                f"two run folders are both run {run_id}: {where[run_id]} and {d}; one results "
                "folder holds a run once (move one of them out)"
            )
        cfg = rec.get("config")
        if not isinstance(cfg, dict):
            raise StoreError(f"{d / RUN_RECORD}: no config (a mapping); {migrate_command(root)}")
        record = {k: v for k, v in rec.items() if k != "config"}
        found = other_hash_version(record)
        if found is not None:
            other_hash.append(f"{d}: {found}")
            continue
        runs[run_id] = StoredRun(run_id, RUN, run_status(d), cfg, record, d)
        where[run_id] = d
    if other_hash:
        raise StoreError(other_hash_message(other_hash, root))
    for d in model_evals:
        rec = _record(d / EVAL_RECORD, "evaluation record", root)
        run_id = str(rec.get("run_id") or "")
        if run_id in runs:
            raise StoreError(f"two folders are both run {run_id}: {where[run_id]} and {d}")
        runs[run_id] = StoredRun(run_id, MODEL_EVAL, RunStatus(DONE), None, rec, d)
        where[run_id] = d
    damaged: list[DamagedResultFile] = []
    seen: dict[tuple[str, ...], Row] = {}
    by_folder = {v: k for k, v in where.items()}
    lost: set[str] = set()  # runs whose own results file is damaged: no run without it
    for part in parts:
        owner = _owner(part.parent, set(by_folder))
        assert owner is not None  # _scan kept only owned parts
        run = runs[by_folder[owner]]
        try:
            rows = read_checked(part, require_sidecar=True)
            _check_columns(part, rows)
        except DamagedResultFile as e:
            damaged.append(e)
            if part.parent == owner:
                lost.add(run.run_id)
            continue
        label_root = part.relative_to(root)
        for i, row in enumerate(rows, start=2):
            label = f"{label_root}:{i}"
            _check_row_identity(row, run, label, owner)
            _add_row(run, (label, row), seen)
    for run in runs.values():  # a finished run whose part is gone is damaged, not missing
        if run.kind == RUN and run.status.state in (DONE, DIVERGED) and run.folder is not None:
            if not (run.folder / PART_NAME).is_file():
                lost.add(run.run_id)
                damaged.append(
                    DamagedResultFile(
                        run.folder / PART_NAME,
                        "is missing, though the run finished (stages/results.json); delete that marker "
                        "and run it again to rewrite it (only the results stage reruns)",
                    )
                )
    if damaged and not allow_damaged:
        raise DamagedResultsError(damaged_message(damaged, allowed=False))
    for run_id in lost:  # left out whole (with its evaluations), as its file is named
        del runs[run_id]
    return Store(root, runs, damaged, parts)


def _check_columns(path: Path, rows: list[dict[str, str]]) -> None:
    """A file of this schema version has every column of the schema (a reader never fills in a
    column that a file lacks): DamagedResultFile naming the columns otherwise."""
    from repro.core.results import COLUMNS

    if rows:
        lacking = [c for c in COLUMNS if c not in rows[0]]
        if lacking:
            raise DamagedResultFile(
                path,
                f"lacks the column(s) {', '.join(lacking)} of schema version {schema.VERSION}: "
                "not written by this suite's writer; rewrite it (delete the run's "
                "stages/results.json and run it again)",
            )


def _check_row_identity(row: dict[str, str], run: StoredRun, label: str, folder: Path) -> None:
    if row.get("run_id") != run.run_id or (run.kind == RUN and row.get("config_hash") != run.config_hash):
        raise StoreError(
            f"{label}: the row names run {row.get('run_id')!r} (config_hash {row.get('config_hash')!r}) "
            f"but lies in the folder of run {run.run_id} ({folder}); a results file belongs to the "
            "run folder it is in: move it back, or delete it and rerun"
        )


def _add_row(run: StoredRun, row: Row, seen: dict[tuple[str, ...], Row]) -> None:
    key = measurement_key(row[1])
    if key in seen:
        first, other = seen[key]
        if other != row[1]:
            diff = sorted(c for c in set(row[1]) | set(other) if row[1].get(c) != other.get(c))
            raise ConflictingRowsError(
                f"two different rows for run {key[0]!r}, eval {key[1]!r}, protocol {key[2]!r}, "
                f"benchmark {key[3]!r}, metric {key[4]!r}: {first} and {row[0]} (they differ in "
                f"{', '.join(diff[:6])}{' ...' if len(diff) > 6 else ''}); remove the one that is "
                "wrong (or move it out of the results folder) and rerun"
            )
        return  # the same row twice (a copied file): kept once
    seen[key] = row
    run.rows.append(row)


def _open_merged(csv_path: Path, allow_damaged: bool) -> Store:
    """A merged set (cluster-repro results): results.csv, its runs.jsonl, both checked: cuts
    first, then the set's version, then its columns."""
    root = csv_path.parent
    fix = f"rerun `cluster-repro results --results {root}` to write the set again"
    try:
        check_output_set(csv_path)
        rows = read_checked(csv_path, require_sidecar=False)
    except DamagedResultFile as e:
        raise DamagedResultsError(damaged_message([e], allowed=False)) from None
    index = csv_path.with_name(csv_path.stem + "." + RUNS_INDEX)
    man = _manifest(csv_path)
    if man is None or man.get("schema") != schema.VERSION or not index.is_file():
        raise OldSchemaError(
            f"{csv_path}: not a results set of schema version {schema.VERSION} (a merged set "
            f"holds {index.name} and a manifest stating its schema; this one was written by "
            f"an older version or by hand); {fix}"
        )
    try:
        _check_columns(csv_path, rows)
    except DamagedResultFile as e:
        raise DamagedResultsError(damaged_message([e], allowed=False)) from None
    runs: dict[str, StoredRun] = {}
    other_hash: list[str] = []
    with open(index, encoding="utf-8") as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                st = RunStatus(**entry["status"])
                folder = (root / entry["folder"]) if entry.get("folder") else None  # relative: to the set
                runs[entry["run_id"]] = StoredRun(
                    entry["run_id"], entry["kind"], st, entry.get("config"), entry["record"], folder
                )
            except (ValueError, KeyError, TypeError) as err:
                raise StoreError(f"{index}:{i}: expected a run entry of the set ({err}); {fix}") from None
            stored = runs[entry["run_id"]]
            found = other_hash_version(stored.record) if isinstance(stored.record, dict) else None
            if stored.kind == RUN and found is not None:
                other_hash.append(f"{index}:{i}: run {stored.run_id}: {found}")
    if other_hash:
        raise StoreError(other_hash_message(other_hash, root))
    seen: dict[tuple[str, ...], Row] = {}
    for i, row in enumerate(rows, start=2):
        run = runs.get(row.get("run_id", ""))
        if run is None:
            raise StoreError(f"{csv_path}:{i}: run {row.get('run_id')!r} is not in {index.name}; {fix}")
        _add_row(run, (f"{csv_path.name}:{i}", row), seen)
    for run in runs.values():  # the folders, where they are still there, for per-item files
        if run.folder is not None and not run.folder.is_dir():
            run.folder = None
    return Store(root, runs, [], [csv_path])


def _manifest(csv_path: Path) -> dict[str, Any] | None:
    from repro.core.results import manifest_path

    try:
        m = read_json(manifest_path(csv_path))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


# ----------------------------------------------------------------------------- merging


# Config keys that say where things were on the machine that ran (no result depends on them:
# they are outside the config hash); a portable set leaves them out.
LOCAL_KEYS = ("output_dir", "data_dir")


def merge_results(
    output_dir: Path, out_csv: Path | None = None, allow_damaged: bool = False, portable: bool = False
) -> tuple[Path, int]:
    """Merge every run's rows under output_dir into one set (`write_set`): results.csv (+ its
    checksum sidecar), results.parquet and results.runs.jsonl (each run's record, stored config
    and status), under one manifest. `portable`: the runs index names no path of this machine
    (no run folders, no `LOCAL_KEYS` in the configs), for a set to share or commit; it reads as
    any set, but what needs the run folders (per-item scores, step tokens, `track export`)
    then has none; and it leaves out the runs not finished (running now, or killed), naming
    them on stderr: they hold no results yet, and a later merge takes them once they end.
    -> (path, rows)."""
    store = open_store(Path(output_dir), allow_damaged=allow_damaged)
    if store.damaged:
        print(f"warning: {damaged_message(store.damaged, allowed=True)}", file=sys.stderr, flush=True)
    out_csv = Path(out_csv or Path(output_dir) / "results.csv")
    runs = sorted(store.runs.values(), key=lambda r: r.run_id)
    if portable:
        unfinished = [r.run_id for r in runs if r.status.state == INCOMPLETE]
        if unfinished:
            print(
                f"note: {len(unfinished)} run(s) not finished are left out of the portable set "
                f"(running now or killed; merge again once they end): {', '.join(unfinished)}",
                file=sys.stderr,
                flush=True,
            )
        runs = [r for r in runs if r.status.state != INCOMPLETE]
    entries = []
    for r in runs:
        e = r.index_entry()
        if portable:
            e["folder"] = None
            e["config"] = {k: v for k, v in (e["config"] or {}).items() if k not in LOCAL_KEYS}
        elif r.folder is not None:  # relative to the set, so a set moved with its folders still finds them
            folder = Path(r.folder).resolve()
            base = out_csv.parent.resolve()
            e["folder"] = str(folder.relative_to(base)) if folder.is_relative_to(base) else str(folder)
        entries.append(e)
    rows = [row for r in runs for _, row in r.rows]
    return out_csv, write_set(out_csv, rows, entries)


def write_set(out_csv: Path, rows: list[dict[str, str]], entries: list[dict[str, Any]]) -> int:
    """Write a merged set at `out_csv`: the rows (sorted), their Parquet, the runs index (one
    entry per run: `StoredRun.index_entry`), each file atomic and the manifest last (a set
    without it reads unfinished). -> rows written."""
    import pandas as pd

    from repro.core.io import atomic_write
    from repro.core.results import (
        COLUMNS,
        begin_output_set,
        finish_output_set,
        pq_path,
        typed_frame,
        write_csv_with_sidecar,
    )

    extra = sorted({c for r in rows for c in r} - set(COLUMNS))  # from a newer writer
    df = pd.DataFrame(rows, columns=COLUMNS + extra, dtype=str).fillna("")
    df = df.sort_values(["name", "method", "run_id", "eval_id", "benchmark", "metric"], kind="stable")
    out_csv = Path(out_csv)
    index = out_csv.with_name(out_csv.stem + "." + RUNS_INDEX)
    lines = "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries)
    begin_output_set(out_csv)  # from here until the manifest is written the set reads unfinished
    write_csv_with_sidecar(out_csv, df.to_csv(index=False), len(df))
    atomic_write(pq_path(out_csv), lambda fh: typed_frame(df).to_parquet(fh, index=False), mode="wb")
    atomic_write(index, lambda fh: fh.write(lines))
    finish_output_set(out_csv, len(df))
    return len(df)
