"""The inline executor: an experiment file's cells one after another in this process, a matched
one once its reference has run (`cluster-repro grid`; the demo)."""

from __future__ import annotations

import sys
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
    from repro.pipeline import run_experiment
    from repro.preflight import require_clean
    from repro.problems import report

    todo = experiment.cells if cells is None else cells
    notes = require_clean([(where_of(experiment, c), c.check_config()) for c in todo])
    if any(notes.values()):
        print(report(notes), file=sys.stderr, flush=True)
    by_id = {c.id: c for c in experiment.cells}
    done: dict[str, Path] = {}
    done_cfg: dict[str, ExperimentConfig] = {}
    for c in todo:
        cfg = c.config() if c.match_of is None else c.check_config()
        if c.match_of is not None:
            ref = by_id[c.match_of]
            matched = resolve_match(
                cfg, c.match_by, done_cfg[ref.id], done[ref.id], ref.id, where_of(experiment, c)
            )
            if matched is None:  # run_experiment returned, so the reference has selected and trained
                raise RuntimeError(f"{where_of(experiment, c)}: {ref.id} has nothing to match ({c.match_by})")
            cfg = matched
            if c.match_by == "compute":
                _say_matched(c.id, cfg)
        print(f"\n=== {c.id} ===", file=sys.stderr, flush=True)
        done[c.id] = run_experiment(cfg, force=force)
        done_cfg[c.id] = cfg
    return list(done.values())


def _say_matched(label: str, cfg: ExperimentConfig) -> None:
    m = cfg.selection.matched or {}
    print(
        f"{label}: match_compute_of {m.get('of')}: {m.get('target_device_s')} device-s ({m.get('costs')}) "
        f"-> kept count {cfg.selection.n}" + (" (capped at the pool)" if m.get("capped_at_pool") else ""),
        file=sys.stderr,
        flush=True,
    )
