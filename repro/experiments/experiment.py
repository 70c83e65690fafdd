"""The experiment file: many experiments in one YAML file, planned into cells by one loader.

    name: my-comparison              # optional: the launch folder's name (default: the file's stem)
    base: ../demo-quick.yaml         # the config every run and cell starts from, relative to this file
    overrides: [train.epochs=1]      # optional: `key.sub=value` strings, for every run and cell
    set: {data.heldout_fraction: 0.0}  # optional: the same, as YAML values (lists, mappings)
    runs:                            # labelled runs (runs.py)
      - label: cluster-r0.5
        overrides: [selection.method=cluster, selection.params.ratio=50]
      - label: random-at-cluster
        match_kept_count_of: cluster-r0.5
        overrides: [selection.method=random]
    grid:                            # a product of axes (grids.py)
      datasets: {demo: {}}
      models: {tiny: {}}
      methods: {full: {overrides: [selection.method=full]}}
      world_sizes: [4]
      seeds: [0, 1]
    estimate: {cluster_kept_at_r100: 0.79}   # optional: the dry run's assumptions (slurm/plan.py)

A file holds `runs:`, `grid:` or both; the shipped ones are in `configs/experiments/`.
`load_experiment` plans every cell (repro/experiments/cells.py: a run becomes a cell whose id is
its label; a grid cell's id is `dataset.model.method[-rRATIO].wsW.sSEED`), each config validated,
no config declared twice. The same cells run three ways:

    `cluster-repro grid FILE`      here, in this process, one after another (inline.py)
    `cluster-repro launch FILE`    as jobs through submitit: on SLURM, or on this machine
                                   (`--cluster local`); `--dry-run` prints the plan (slurm/)
    `cluster-repro status FILE`    where each cell stands

Every command that takes a file takes the same arguments (`add_arguments`): overrides for every
cell, `--base CONFIG` (every run and cell starts from CONFIG instead of the file's base) and
`--only AXIS=V` (a part of the cells, with the cells they match).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError, check_name, parse_override, read_yaml_file
from repro.core.config.load import SHIPPED_CONFIGS, resolve_config_path
from repro.core.config.schema import ExperimentConfig
from repro.experiments.cells import Cell, Experiment, refuse_repeats, select_cells
from repro.experiments.grids import GRID_KEYS, plan_grid
from repro.experiments.runs import plan_runs

SHIPPED = "configs/experiments/"
TOP_KEYS = ("name", "base", "overrides", "set", "runs", "grid", "estimate")
_CONFIG_KEYS = {f.name for f in dataclasses.fields(ExperimentConfig)} - {"name"}


def load_experiment(
    path: str | Path, extra: list[str] | tuple[str, ...] = (), base: str | Path | None = None
) -> Experiment:
    """The cells of an experiment file (`path`, or a shipped one by name), with the command
    line's `extra` overrides, starting from `base` (a config file or shipped name) instead of
    the file's own base when given. ConfigError naming the file, the key and what was expected."""
    p = resolve_config_path(path, "experiment file")
    data = read_yaml_file(p, "experiment file", f" (shipped experiment files: {SHIPPED})") or {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{p}: expected an experiment file (a mapping with runs: and/or grid:), got {type(data).__name__}"
        )
    _check_top(data, p)
    name = data.get("name", p.stem)
    if not isinstance(name, str):
        raise ConfigError(f"{p}: name: expected a string (the launch folder's name), got {name!r}")
    check_name(name, f"{p}: name")  # the launch folder, and the start of every job name
    base_data = _base(data, p, base)
    shared = {k: data[k] for k in ("set", "overrides") if k in data}
    pairs = [parse_override(o) for o in extra]
    grid = plan_grid(data["grid"], p, base_data, shared, pairs) if "grid" in data else []
    runs = plan_runs(data["runs"], p, base_data, shared, pairs) if "runs" in data else []
    clash = sorted({d.cell.id for d in grid} & {d.cell.id for d in runs})
    if clash:
        raise ConfigError(
            f"{p}: runs: the labels {clash} are also grid cell ids (one run folder, two cells): "
            "give the runs other labels"
        )
    refuse_repeats(grid + runs, p)  # one experiment, one cell, across the runs and the grid
    estimate = data.get("estimate") or {}
    if not isinstance(estimate, dict):
        raise ConfigError(f"{p}: estimate: expected a mapping of dry-run assumptions, got {estimate!r}")
    return Experiment(name, p, [d.cell for d in grid + runs], dict(estimate))


def _check_top(data: dict[str, Any], p: Path) -> None:
    """ConfigError for a file that is not an experiment file, or has keys it does not know."""
    keys = set(data)
    if "runs" not in keys and "grid" not in keys:
        if "base" not in keys and keys & _CONFIG_KEYS:
            shipped = SHIPPED_CONFIGS / "experiments" / f"{p.stem}.yaml"
            hint = f"; or did you mean experiments/{p.stem}?" if shipped.is_file() else ""
            raise ConfigError(
                f"{p}: this is an experiment config (one experiment), not an experiment file (a base "
                f"config with runs: and/or grid:; shipped ones: {SHIPPED}); run it with "
                f"`cluster-repro run {p}`{hint}"
            )
        raise ConfigError(
            f"{p}: an experiment file needs runs: (labelled runs) and/or grid: (axes: "
            f"{', '.join(GRID_KEYS)}); found keys: {', '.join(map(str, data)) or 'none'}"
        )
    axes = sorted(keys & set(GRID_KEYS))
    if axes:
        raise ConfigError(f"{p}: {', '.join(axes)}: axes of a grid; write them under the key grid:")
    for k in sorted(keys - set(TOP_KEYS), key=str):
        hint = difflib.get_close_matches(str(k), TOP_KEYS, n=1, cutoff=0.6)
        raise ConfigError(
            f"{p}: unknown key {k!r}{f'; did you mean {hint[0]!r}?' if hint else ''} "
            f"(allowed: {', '.join(TOP_KEYS)})"
        )
    if "base" not in keys:
        raise ConfigError(
            f"{p}: base: required: the config file every run and cell starts from, relative to this file"
        )


def _base(data: dict[str, Any], p: Path, base: str | Path | None) -> dict[str, Any]:
    """The mapping of the base config: `base` (--base) when given, else the file's `base`."""
    if base is not None:
        base_path = resolve_config_path(base, "--base")
        where = f"--base {base}"
    else:
        if not isinstance(data["base"], str):
            raise ConfigError(f"{p}: base: expected a config file name, got {data['base']!r}")
        base_path = (p.parent / data["base"]).resolve()
        if not base_path.is_file():
            raise ConfigError(f"{p}: base: config {data['base']!r} not found (looked at {base_path})")
        where = f"{p}: base"
    out = read_yaml_file(base_path, "base config") or {}
    if not isinstance(out, dict):
        raise ConfigError(f"{where}: {base_path} is not a config (a mapping), got {type(out).__name__}")
    if {"runs", "grid"} & set(out):
        raise ConfigError(f"{where}: {base_path} is an experiment file; a base is one experiment config")
    return out


def is_experiment_file(path: str | Path) -> bool:
    """Whether `path` (or the shipped file of that name) is a mapping with runs: or grid:."""
    try:
        data = read_yaml_file(resolve_config_path(path), "file")
    except ConfigError:
        return False
    return isinstance(data, dict) and bool({"runs", "grid"} & set(data))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of every command that takes an experiment file (grid, launch, status)."""
    p.add_argument(
        "experiment",
        metavar="EXPERIMENT",
        help="an experiment file (YAML with runs: and/or grid:), or a shipped one by name, e.g. "
        f"experiments/demo-grid ({SHIPPED}demo-grid.yaml; `cluster-repro ls configs` lists them)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key.sub=value",
        help="config overrides for every run and cell, e.g. data_dir=DATA_DIR",
    )
    p.add_argument(
        "--base",
        default=None,
        metavar="CONFIG",
        help="every run and cell starts from this config instead of the file's base, e.g. "
        "demo-quick (configs/demo-quick.yaml) for a quick pass of a demo experiment",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="AXIS=V[,V]",
        help="only the cells whose axis has one of these values (dataset, model, method, ratio, "
        "world_size, seed, label, id); repeatable; the cells they match come along",
    )


def experiment_of(
    args: argparse.Namespace, extra: list[str] | tuple[str, ...] = ()
) -> tuple[Experiment, list[Cell]]:
    """The experiment a command's arguments (`add_arguments`) name, and its cells that `--only`
    picks; `extra`: overrides after the command line's."""
    exp = load_experiment(args.experiment, [*args.overrides, *extra], args.base)
    cells = select_cells(exp, args.only)
    if not cells:
        raise ConfigError(f"--only {' '.join(args.only)}: no cell of {exp.path} matches")
    return exp, cells
