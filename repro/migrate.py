"""Rebuild what an older version of the suite wrote: the one place that knows older versions.

    cluster-repro results --migrate DIR

Every reader of results (repro/core/store.py) refuses files of another schema version with this
command; nothing else keeps a branch for them. From version 1 to 2 (schema.VERSION):

- a run folder without `run.json`: the record is written from its stored config, which must still
  hash to the folder's name (else the run is named, and rerunning it is the fix: so is a run
  whose `run.json` states another config hash version, repro/core/config/schema.py);
- its `results.part.csv` (a checksum file that states no schema): rewritten by the results stage
  from the run folder's own stage files, as a rerun of that stage would, without training;
- an evaluation by `cluster-repro eval` of version 1 (`<run>/eval-cli/`, or `runs/eval/<name>/`
  without `model-eval.json`): its rows carry no eval identity, so they cannot be placed. Its part file
  is renamed to `results.v1.csv` (kept, no longer read) and the command that evaluates again is
  printed: its settings are in the `lm_eval_results.json` beside it.

What cannot be rebuilt is named with the reason, and the command exits with status 2 after
doing the rest.
"""

from __future__ import annotations

import sys
from pathlib import Path

from repro.core import schema
from repro.core.io import read_json
from repro.core.results import PART_NAME, sidecar_path
from repro.core.store import (
    EVAL_RECORD,
    NOT_RUNS,
    RUN_RECORD,
    StoreError,
    other_hash_version,
    part_schema,
    write_run_record,
)

V1_NAME = "results.v1.csv"


def _skipped(d: Path, root: Path) -> bool:
    rel = d.relative_to(root).parts if d != root else ()
    return any(p in NOT_RUNS or p.startswith(".") for p in rel)


def _current_record(path: Path) -> bool:
    """A run record of this version's config hash (a missing or unreadable one is not)."""
    try:
        rec = read_json(path)
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and other_hash_version(rec) is None


def migrate_run_folder(run_dir: Path) -> str | None:
    """Bring one run folder to this version; returns what was done (None: nothing to do).
    StoreError naming the folder and the fix when it cannot be rebuilt."""
    from repro.core.config.load import load_config
    from repro.core.lm_eval_json import LM_EVAL_NAME, write_lm_eval_results
    from repro.core.results import write_rows
    from repro.core.rundir import stage_marker
    from repro.run_rows import result_rows

    part = run_dir / PART_NAME
    current_part = not part.is_file() or part_schema(part) == schema.VERSION
    if _current_record(run_dir / RUN_RECORD) and current_part:
        return None
    try:
        cfg = load_config(run_dir / "config.yaml")
    except Exception as e:  # noqa: BLE001 - a config this version cannot read: named, not raised
        raise StoreError(
            f"{run_dir}: its config.yaml does not load here ({e}); rerun the run with this version's "
            "config, then move this folder out of the results folder"
        ) from None
    if cfg.hash() != run_dir.name or cfg.name != run_dir.parent.name:
        raise StoreError(
            f"{run_dir}: its config now hashes to {cfg.name}/{cfg.hash()}, not to the folder's "
            f"{run_dir.parent.name}/{run_dir.name}: this version identifies it otherwise; rerun it "
            f"(`cluster-repro run {run_dir / 'config.yaml'}`, into {cfg.name}/{cfg.hash()}), then "
            "move this folder out of the results folder"
        )
    done = []
    if stage_marker(run_dir, "results").is_file():
        try:
            rows = result_rows(cfg, run_dir)
        except Exception as e:  # noqa: BLE001 - stage files of an older layout: named, not raised
            raise StoreError(
                f"{run_dir}: its stage files cannot be read by this version ({type(e).__name__}: "
                f"{e}); rerun it with `cluster-repro run {run_dir / 'config.yaml'} --force`"
            ) from None
        write_rows(part, rows)
        write_lm_eval_results(run_dir / LM_EVAL_NAME, rows)
        done.append(f"results rebuilt ({len(rows)} rows)")
    write_run_record(run_dir, cfg)
    done.append(f"{RUN_RECORD} written")
    return ", ".join(done)


def _retire_v1_eval(part: Path) -> str:
    """Rename an old evaluation's part (and its checksum) so no reader takes it; the command
    that evaluates again."""
    target = part.with_name(V1_NAME)
    part.rename(target)
    side = sidecar_path(part)
    if side.is_file():
        side.rename(sidecar_path(target))
    run = part.parent.parent if part.parent.name == "eval-cli" else None
    again = f"cluster-repro eval --run {run} ..." if run else "cluster-repro eval --model ..."
    return (
        f"{part}: an evaluation of an older version, renamed to {target.name}; evaluate again with "
        f"`{again}` (its settings: {part.parent / 'lm_eval_results.json'})"
    )


def migrate_store(root: Path) -> list[str]:
    """Migrate every run folder and old evaluation under `root`; returns the lines printed.
    StoreError (exit status 2) listing what could not be rebuilt, after doing the rest."""
    root = Path(root)
    lines: list[str] = []
    problems: list[str] = []
    for cfg_path in sorted(root.rglob("config.yaml")):
        d = cfg_path.parent
        if _skipped(d, root) or not (d / "stages").is_dir():
            continue
        try:
            what = migrate_run_folder(d)
        except StoreError as e:
            problems.append(str(e))
            continue
        if what:
            lines.append(f"{d}: {what}")
    for part in sorted(root.rglob(PART_NAME)):
        d = part.parent
        if _skipped(d, root):
            continue
        if d.name == "eval-cli" or (d.parent.name == "eval" and not (d / EVAL_RECORD).is_file()):
            lines.append(_retire_v1_eval(part))
    for line in lines:
        print(f"migrate: {line}", file=sys.stderr)
    if not lines and not problems:
        print(
            f"migrate: everything under {root} is of schema version {schema.VERSION} already", file=sys.stderr
        )
    if problems:
        raise StoreError(
            f"{len(problems)} run folder(s) under {root} could not be migrated:\n"
            + "\n".join(f"  {p}" for p in problems)
        )
    return lines
