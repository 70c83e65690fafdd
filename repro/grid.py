"""Run lists: several experiments that share a base config, run one after another.

A run-list file (YAML):

    base: demo.yaml                  # a config file, relative to this file
    overrides: [output_dir=runs]     # optional, applied to every run
    runs:
      - label: cluster-r0.5
        overrides: [selection.method=cluster, selection.params.ratio=50,
                    allocation.method=cluster-interleave, allocation.weight_mode=rank]
      - label: random-like-cluster-r0.5
        match_kept_count_of: cluster-r0.5    # selection.n = that run's kept count
        overrides: [selection.method=random]

`match_kept_count_of` is how a baseline is compared at the same budget as a CluSTER run whose
kept count is only known once its clusters are. (The SLURM launcher expands paper-scale grids;
this is the local, sequential form the demo and the mini reproductions use.)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from repro.core.config import (ConfigError, ExperimentConfig, load_config, read_yaml_file,
                               resolve_config_path)
from repro.core.io import read_json


@dataclass
class RunSpec:
    label: str
    overrides: list[str] = field(default_factory=list)
    match_kept_count_of: str | None = None


@dataclass
class RunList:
    base: Path
    overrides: list[str]
    runs: list[RunSpec]
    path: Path | None = None  # the run-list file, for messages


def _override_list(value: object, where: str) -> None:
    """ConfigError unless `value` is null or a list of 'key.sub=value' strings."""
    if value is not None and (not isinstance(value, list)
                              or not all(isinstance(o, str) for o in value)):
        raise ConfigError(f"{where}: expected a list of 'key.sub=value' strings, got {value!r}")


def load_run_list(path: str | Path) -> RunList:
    p = resolve_config_path(path, "run-list file")
    data = read_yaml_file(p, "run-list file") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping with 'base' and 'runs' at the top level")
    unknown = set(data) - {"base", "overrides", "runs"}
    if unknown:
        raise ConfigError(f"{p}: unknown keys {sorted(unknown)} (allowed: base, overrides, runs)")
    if "base" not in data or not data.get("runs"):
        raise ConfigError(f"{p}: needs 'base' (a config file) and a non-empty 'runs' list")
    if not isinstance(data["base"], str) or not isinstance(data["runs"], list):
        raise ConfigError(f"{p}: 'base' must be a config file name and 'runs' a list of runs, "
                          f"got {type(data['base']).__name__} and {type(data['runs']).__name__}")
    _override_list(data.get("overrides"), f"{p}: overrides")
    runs, labels = [], set()
    for i, r in enumerate(data["runs"]):
        if not isinstance(r, dict) or "label" not in r:
            raise ConfigError(f"{p}: runs[{i}] needs a 'label'")
        extra = set(r) - {"label", "overrides", "match_kept_count_of"}
        if extra:
            raise ConfigError(f"{p}: runs[{i}] has unknown keys {sorted(extra)} "
                              "(allowed: label, overrides, match_kept_count_of)")
        _override_list(r.get("overrides"), f"{p}: runs[{i}].overrides")
        spec = RunSpec(str(r["label"]), [str(o) for o in r.get("overrides") or []],
                       r.get("match_kept_count_of"))
        if spec.match_kept_count_of is not None and spec.match_kept_count_of not in labels:
            raise ConfigError(f"{p}: runs[{i}] ({spec.label}) matches the kept count of "
                              f"{spec.match_kept_count_of!r}, which must be an earlier run's label")
        labels.add(spec.label)
        runs.append(spec)
    return RunList((p.parent / data["base"]).resolve(), [str(o) for o in data.get("overrides") or []],
                   runs, p)


def run_configs(rl: RunList, extra: list[str] = ()) -> list[tuple[RunSpec, ExperimentConfig]]:
    """Every run's config (validated up front, so a typo fails before hours of work). A run that
    takes another's kept count has no selection.n yet: its config selects from the whole pool."""
    return [(r, load_config(rl.base, [*rl.overrides, *r.overrides, *extra])) for r in rl.runs]


def preflight_run_list(rl: RunList, extra: list[str] = ()) -> dict[str, list]:
    """Preflight every run (repro/preflight.py); PreflightError naming each run with a problem."""
    from repro.preflight import require_clean

    where = f"{rl.path} " if rl.path else ""
    return require_clean([(f"{where}run {r.label}", cfg) for r, cfg in run_configs(rl, extra)])


def run_list(rl: RunList, extra: list[str] = (), force: bool = False) -> list[Path]:
    """Run every experiment of the list in order; returns their run directories."""
    from repro.core.rundir import stage_marker
    from repro.pipeline import run_experiment
    from repro.preflight import report

    notes = preflight_run_list(rl, extra)  # validate and check all first
    if any(notes.values()):
        print(report(notes), file=sys.stderr, flush=True)
    done: dict[str, Path] = {}
    for spec in rl.runs:
        ov = [*rl.overrides, *spec.overrides, *extra]
        if spec.match_kept_count_of:
            ref = done[spec.match_kept_count_of]
            kept = read_json(stage_marker(ref, "select"))["n_unique"]
            ov.append(f"selection.n={kept}")
        cfg = load_config(rl.base, ov)
        print(f"\n=== {spec.label} ===", file=sys.stderr, flush=True)
        done[spec.label] = run_experiment(cfg, force=force)
    return list(done.values())
