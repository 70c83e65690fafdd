"""Cells: what an experiment file plans (repro/experiments/experiment.py), one config each.

A cell is one experiment (`repro/core/config.py`): its id (a run's label, or a grid cell's
`dataset.model.method[-rRATIO].wsW.sSEED`), its axes (what `--only` picks by), its config as a
mapping, and the cell whose kept count or compute it takes. `Experiment` is a planned file: its
name (the launch folder's), its path, its cells and the dry run's assumptions. The settings
helpers here (`entry_settings`, `apply_settings`) are how both parts of a file, and the file's
shared keys, write into a cell's config.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError, parse_override, set_dotted
from repro.core.config.load import from_dict
from repro.core.config.schema import ExperimentConfig
from repro.experiments.sharing import feature_key as config_feature_key
from repro.experiments.sharing import feature_pass

AXES = ("dataset", "model", "method", "ratio", "world_size", "seed")


@dataclass
class Cell:
    """One experiment of an experiment file: its axes, its config, and what it waits for."""

    id: str  # a run's label, or e.g. magicoder.codellama-python-7b.cluster-r50.ws4.s42
    axes: dict[str, Any]  # AXES, and a run's `label`
    data: dict[str, Any]  # the config as a mapping (before selection.n of a matched cell)
    match_of: str | None = None  # id of the cell whose kept count (or compute) this one takes
    estimate: dict[str, Any] = field(default_factory=dict)  # rows, tokens_per_example, params_b
    match_by: str = "kept_count"  # or "compute" (match_compute_of: compute.py)

    @property
    def is_run(self) -> bool:
        """A labelled run of `runs:` (not a cell of `grid:`)."""
        return "label" in self.axes

    def config(self) -> ExperimentConfig:
        """The validated config of a cell that matches no other (a matched cell's final config
        comes from its reference's run: repro/experiments/matching.py resolve_match)."""
        if self.match_of is not None:
            raise ConfigError(
                f"cell {self.id}: its budget comes from {self.match_of}'s run (resolve_match), not "
                "from its own config"
            )
        return self.check_config()

    def check_config(self) -> ExperimentConfig:
        """The config as far as it is known before anything runs: the final one, or for a matched
        cell (whose kept count is known only once its reference has selected) the same config
        selecting from the whole pool. What preflight checks, the plan estimates and the
        features are keyed by: none of them depends on the kept count."""
        return from_dict(self.data, source=f"cell {self.id}")

    def feature_pass(self) -> dict[str, Any] | None:
        """What identifies the features this cell's selector computes, if it shares any
        (sharing.py); None: the cell computes no shareable features."""
        return feature_pass(self.check_config())

    def feature_key(self) -> str | None:
        """Cells with the same key have the same pool and the same features (12 hex digits;
        sharing.py); None when the cell's selector computes no shareable features."""
        return config_feature_key(self.check_config())


@dataclass
class Experiment:
    """A planned experiment file: what `grid`, `launch` and `status` take."""

    name: str  # the launch folder's name (<output_dir>/_launch/<name>/) and the jobs' prefix
    path: Path
    cells: list[Cell]  # a matched cell after the cell it matches
    estimate: dict[str, Any]  # the dry run's assumptions (slurm/plan.py)


# ----------------------------------------------------------------------------- settings


def key_of(where: str, key: str) -> str:
    """`where` (a file and the path of an entry in it: '<file>: runs[2]', or the file's top:
    '<file>:') and one of its keys, as messages name them."""
    return f"{where} {key}" if where.endswith(":") else f"{where}.{key}"


def entry_settings(entry: dict[str, Any], where: str) -> tuple[list[str], dict[str, Any]]:
    """An entry's `overrides` ('key.sub=value' strings) and `set` (dotted keys to YAML values);
    ConfigError naming `where` (the file and the entry, `key_of`) and the key."""
    ov = entry.get("overrides") or []
    st = entry.get("set") or {}
    if not isinstance(ov, list) or not all(isinstance(o, str) for o in ov):
        raise ConfigError(
            f"{key_of(where, 'overrides')}: expected a list of 'key.sub=value' strings, got {ov!r}"
        )
    if not isinstance(st, dict):
        raise ConfigError(f"{key_of(where, 'set')}: expected a mapping of dotted keys to values, got {st!r}")
    return ov, st


def apply_settings(data: dict[str, Any], entry: dict[str, Any], where: str) -> None:
    """Write an entry's `set`, then its `overrides`, into the config mapping `data`."""
    ov, st = entry_settings(entry, where)
    for k, v in st.items():
        set_dotted(data, str(k), copy.deepcopy(v), f"{key_of(where, 'set')}:")
    for o in ov:
        try:
            k, v = parse_override(o)
        except ConfigError as e:
            raise ConfigError(f"{key_of(where, 'overrides')}: {e}") from None
        set_dotted(data, k, v, f"{key_of(where, 'overrides')}:")


def apply_overrides(data: dict[str, Any], overrides: list[tuple[str, Any]]) -> None:
    """Write the command line's parsed overrides into `data`."""
    for k, v in overrides:
        set_dotted(data, k, copy.deepcopy(v), "command line:")


# ----------------------------------------------------------------------------- one experiment, one cell


@dataclass
class Declared:
    """A planned cell, how a message names it, and its config before any match (validated)."""

    cell: Cell
    named: str
    config: ExperimentConfig


def declared(c: Cell, named: str, config: ExperimentConfig | None = None) -> Declared:
    """A cell as `refuse_repeats` takes it; `named`: how a message names it; `config`: its
    `check_config()` where already built."""
    return Declared(c, named, config if config is not None else c.check_config())


def refuse_repeats(entries: list[Declared], path: Path) -> None:
    """ConfigError naming both declarations when two entries are one experiment. Unmatched
    entries are one experiment when their config hashes are (the run folder's key: what trains);
    matched ones, whose final config is known only once their reference has run, when their
    configs before the match are and they match the same experiment the same way."""
    by_id = {e.cell.id: e for e in entries}
    keys: dict[str, tuple] = {}

    def identity(eid: str) -> tuple:
        if eid not in keys:
            e = by_id[eid]
            ref = e.cell.match_of
            h = e.config.hash()
            keys[eid] = (h,) if ref is None else (h, e.cell.match_by, identity(ref))
        return keys[eid]

    first: dict[tuple, Declared] = {}
    for e in entries:
        k = identity(e.cell.id)
        if k in first:
            how = " before the match, matched to the same reference" if e.cell.match_of else ""
            raise ConfigError(
                f"{path}: {first[k].named} and {e.named} are the same experiment (config hash "
                f"{k[0]}{how}): one config trains once, and its seeds are its replicates. Names, "
                "paths and eval settings are not part of what trains; remove one, or make them "
                "differ in what they train"
            )
        first[k] = e


# ----------------------------------------------------------------------------- --only


def select_cells(experiment: Experiment, only: list[str]) -> list[Cell]:
    """Cells whose axes match every `axis=value[,value]` filter (`--only`), plus the cells they
    match (a matched cell needs its reference)."""
    keys = (*AXES, "label", "id")
    filters: dict[str, set[str]] = {}
    for f in only:
        if "=" not in f:
            raise ConfigError(f"--only {f!r}: expected axis=value (axes: {', '.join(keys)})")
        k, v = f.split("=", 1)
        if k not in keys:
            raise ConfigError(f"--only {f!r}: unknown axis {k!r} (axes: {', '.join(keys)})")
        filters.setdefault(k, set()).update(v.split(","))
    keep = [
        c
        for c in experiment.cells
        if all(str(c.id if k == "id" else c.axes.get(k)) in vs for k, vs in filters.items())
    ]
    need: set[str] = set()
    todo = [c.match_of for c in keep if c.match_of]
    by_id = {c.id: c for c in experiment.cells}
    while todo:  # a reference's own reference comes along too
        ref = todo.pop()
        if ref is not None and ref not in need:
            need.add(ref)
            todo.append(by_id[ref].match_of)
    return [c for c in experiment.cells if c in keep or c.id in need]
