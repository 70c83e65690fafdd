"""One experiment file, one planner: labelled runs and/or a grid, turned into cells.

    name: my-comparison              # the launch folder's name (default: the file's stem)
    base: demo-quick.yaml            # a config file, relative to this file
    overrides: [output_dir=runs]     # for every run and cell (optional)
    runs:                            # labelled runs (what a run list holds)
      - label: cluster-r0.5
        overrides: [selection.method=cluster, selection.params.ratio=50]
      - label: random-at-cluster
        match_kept_count_of: cluster-r0.5
        overrides: [selection.method=random]
    grid:                            # a product (what a grid file holds at its top level)
      datasets: {demo: {}}
      models: {tiny: {}}
      methods: {full: {overrides: [selection.method=full]}}
      world_sizes: [4]
      seeds: [0, 1]

Either part alone is an experiment file, so every run list (`base` + `runs`) is one as it is, and
a grid file (its axes at the top level) is read as one too, with a note naming the `grid:` key.
`load_experiment` plans the cells (repro/experiments/grids.py Cell: a run becomes a cell whose id
is its label); the executors run them:

    inline   run_cells here, in this process, in order (`cluster-repro grid`; tests)
    local    submitit's local executor, one job after another on this machine
             (`cluster-repro launch FILE --cluster local`)
    slurm    submitit on SLURM, with dependencies and arrays (`cluster-repro launch FILE`)

`cluster-repro status` takes the same file. `match_kept_count_of` and `match_compute_of`
(compute.py) work in both parts (a run names an earlier run's label; a grid method names another
method).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError, read_yaml_file
from repro.core.config.load import load_config, resolve_config_path
from repro.experiments.files import _GRID_AXES, CONFIG, RUN_LIST, kind_of, read_mapping
from repro.experiments.grids import Cell, Grid, declared, grid_cell_name, grid_from_mapping, refuse_repeats
from repro.experiments.inline import run_in_order
from repro.experiments.runlists import run_list_from_mapping

_SHARED = ("name", "base", "overrides", "set")
_TOP = {*_SHARED, "runs", "grid"}


def has_grid(path: str | Path) -> bool:
    """Whether the file has a grid part (`grid:`, or a grid file's axes at the top level)."""
    p = resolve_config_path(path, "experiment file")
    data = read_yaml_file(p, "experiment file") or {}
    return isinstance(data, dict) and ("grid" in data or bool(set(data) & _GRID_AXES))


def load_experiment(path: str | Path, extra: list[str] | tuple[str, ...] = ()) -> Grid:
    """The cells of an experiment file (runs, grid, or both), every config validated now."""
    p = resolve_config_path(path, "experiment file")
    data = read_yaml_file(p, "experiment file") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    if kind_of(data) == CONFIG:  # one experiment config: names `cluster-repro run`
        read_mapping(p, RUN_LIST)
    if set(data) & _GRID_AXES and "grid" not in data:  # a grid file of before `grid:`
        print(
            f"note: {p}: a grid file; an experiment file holds these axes under the key `grid:` "
            "(beside `runs:`); it is read as it is",
            file=sys.stderr,
        )
        return grid_from_mapping(data, p, extra)
    unknown = set(data) - _TOP
    if unknown:
        raise ConfigError(f"{p}: unknown keys {sorted(unknown)} (allowed: {', '.join(sorted(_TOP))})")
    if "runs" not in data and "grid" not in data:
        raise ConfigError(f"{p}: an experiment file needs `runs:` (labelled runs) and/or `grid:` (axes)")
    name = data.get("name", p.stem)
    cells: list[Cell] = []
    estimate: dict[str, Any] = {}
    if "grid" in data:
        if not isinstance(data["grid"], dict):
            raise ConfigError(f"{p}: grid: expected a mapping of axes (datasets, models, methods, ...)")
        g = grid_from_mapping(
            {**{k: data[k] for k in _SHARED if k in data}, "name": name, **data["grid"]}, p, extra
        )
        cells += g.cells
        estimate = g.estimate
    runs = run_cells_of(data, p, extra) if "runs" in data else []
    ids = [c.id for c in cells + runs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"{p}: {dup} name both a run and a grid cell: give the run another label")
    if runs:  # one experiment, one cell, across the runs and the grid (grid_from_mapping checked the grid)
        named = [declared(c, grid_cell_name(c)) for c in cells]
        refuse_repeats(named + [declared(c, f"runs[{i}] ({c.id})") for i, c in enumerate(runs)], p)
    return Grid(str(name), p, cells + runs, estimate)


def run_cells_of(data: dict[str, Any], p: Path, extra: list[str] | tuple[str, ...] = ()) -> list[Cell]:
    """The labelled runs as cells: id = label, axes from each run's config (so `--only`, the plan
    and the launcher read them as they read a grid's), the matched run's reference by label."""
    if "set" in data:
        raise ConfigError(f"{p}: set: applies to the grid's cells; for runs, write `overrides`")
    from repro.contracts import unmatchable
    from repro.experiments.compute import check_compute_matchable, same_inputs_or_error

    rl = run_list_from_mapping({k: data[k] for k in ("base", "overrides", "runs") if k in data}, p)
    cells = []
    by_label: dict[str, Any] = {}
    for r in rl.runs:
        cfg = load_config(rl.base, [*rl.overrides, *r.overrides, *extra])
        by_label[r.label] = cfg
        if r.match_ref:  # what the run list's preflight refuses, refused as cells too
            why = unmatchable(cfg.selection.method, r.match_ref, r.match_key)
            if why:
                raise ConfigError(f"{p}: run {r.label}: {r.match_key}: {why}")
        if r.match_compute_of:
            same_inputs_or_error(cfg, by_label[r.match_compute_of], f"{p}: run {r.label}", r.match_compute_of)
            check_compute_matchable(cfg, f"{p}: run {r.label}")
        axes = {
            "dataset": "+".join(Path(s.path).stem for s in cfg.data.sources),
            "model": cfg.model.name_or_path,
            "method": cfg.selection.method,
            "ratio": cfg.selection.params.get("ratio"),
            "world_size": cfg.world_size,
            "seed": cfg.seed,
            "label": r.label,
        }
        by = "compute" if r.match_compute_of else "kept_count"
        cells.append(Cell(r.label, axes, cfg.to_dict(), r.match_ref, {}, match_by=by))
    return cells


def run_cells(grid: Grid, force: bool = False) -> list[Path]:
    """The inline executor: every cell in order, in this process (a matched cell after its
    reference, which the planner puts first). Preflight checks every cell before any runs."""
    from repro.preflight import require_clean
    from repro.problems import report

    notes = require_clean([(f"{grid.path} cell {c.id}", c.check_config()) for c in grid.cells])
    if any(notes.values()):
        print(report(notes), file=sys.stderr, flush=True)
    return run_in_order(
        [
            (c.id, c.config() if c.match_of is None else c.check_config(), c.match_of, c.match_by)
            for c in grid.cells
        ],
        where=lambda cid: f"{grid.path}: cell {cid}",
        label_of=lambda ref: _label_of(grid, ref),
        force=force,
    )


def _label_of(grid: Grid, cell_id: str) -> str:
    """What a compute match's record calls the cell it matches: a run's label, or the cell id."""
    return next((str(c.axes.get("label") or c.id) for c in grid.cells if c.id == cell_id), cell_id)
