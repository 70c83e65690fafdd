"""The inline executor: an experiment file's cells one after another in this process, a matched
one once its reference has run (`cluster-repro grid`; the demo)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from repro.core.config.schema import ExperimentConfig
from repro.experiments.cells import Cell, Experiment
from repro.experiments.matching import resolve_match


def where_of(experiment: Experiment, c: Cell) -> str:
    """How preflight and messages name a cell: '<file> run <label>' or '<file> cell <id>'."""
    return f"{experiment.path} {'run' if c.is_run else 'cell'} {c.id}"


def run_cells(experiment: Experiment, cells: list[Cell] | None = None, force: bool = False) -> list[Path]:
    """Run `cells` (default: all of the experiment's) in order, in this process; returns their run
    directories. Preflight checks every cell before any runs (repro/preflight.py); a matched cell
    runs at its reference's kept count or cost once the reference has run (the planner puts the
    reference first)."""
    from repro.preflight import require_clean
    from repro.problems import report

    todo = experiment.cells if cells is None else cells
    notes = require_clean([(where_of(experiment, c), c.check_config()) for c in todo])
    if any(notes.values()):
        print(report(notes), file=sys.stderr, flush=True)
    by_id = {c.id: c for c in experiment.cells}
    return run_in_order(
        [
            (c.id, c.config() if c.match_of is None else c.check_config(), c.match_of, c.match_by)
            for c in todo
        ],
        where=lambda cid: where_of(experiment, by_id[cid]),
        force=force,
    )


def run_in_order(
    items: list[tuple[str, ExperimentConfig, str | None, str]],
    where: Callable[[str], str],
    force: bool = False,
) -> list[Path]:
    """Run (id, config, matched-to id or None, "kept_count" or "compute") items one after another
    in this process, a matched one at its reference's kept count or cost once that has run (the
    reference comes first); returns the run directories. What `grid` runs (run_cells) and what
    `track run` runs (repro/tracks/runs.py); `where(id)` names an item in messages."""
    from repro.pipeline import run_experiment

    done: dict[str, Path] = {}
    done_cfg: dict[str, ExperimentConfig] = {}
    for item_id, cfg, ref, by in items:
        if ref is not None:
            matched = resolve_match(cfg, by, done_cfg[ref], done[ref], ref, where(item_id))
            if matched is None:  # run_experiment returned, so the reference has selected and trained
                raise RuntimeError(f"{where(item_id)}: {ref} has nothing to match ({by})")
            cfg = matched
            if by == "compute":
                _say_matched(item_id, cfg)
        print(f"\n=== {item_id} ===", file=sys.stderr, flush=True)
        done[item_id] = run_experiment(cfg, force=force)
        done_cfg[item_id] = cfg
    return list(done.values())


def _say_matched(label: str, cfg: ExperimentConfig) -> None:
    m = cfg.selection.matched or {}
    print(
        f"{label}: match_compute_of {m.get('of')}: {m.get('target_device_s')} device-s ({m.get('costs')}) "
        f"-> kept count {cfg.selection.n}" + (" (capped at the pool)" if m.get("capped_at_pool") else ""),
        file=sys.stderr,
        flush=True,
    )
