"""Run lists: several experiments that share a base config, run one after another here.

A run-list file (YAML; `cluster-repro grid` runs one, the shipped ones are in configs/runs/):

    base: demo.yaml                  # a config file, relative to this file
    overrides: [output_dir=runs]     # optional, applied to every run
    runs:
      - label: cluster-r0.5
        overrides: [selection.method=cluster, selection.params.ratio=50,
                    allocation.method=cluster-interleave, allocation.weight_mode=rank]
      - label: random-like-cluster-r0.5
        match_kept_count_of: cluster-r0.5    # selection.n = that run's kept count
        overrides: [selection.method=random]
      - label: random-compute-cluster-r0.5
        match_compute_of: cluster-r0.5       # selection.n: that run's cost (selection + training)
        overrides: [selection.method=random]

`match_kept_count_of` (matching.py) is how a baseline is compared at the same budget as a CluSTER
run whose kept count is only known once its clusters are; `match_compute_of` (compute.py) at the
same cost, selection included, once that run has trained. This is the local, sequential form the
demo and the mini reproductions use; grid files (grids.py) are the paper-scale form that
`cluster-repro launch` submits.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from repro.core.config.builder import ConfigError
from repro.core.config.load import load_config, resolve_config_path
from repro.core.config.schema import ExperimentConfig
from repro.experiments.compute import (
    COMPUTE_KEY,
    check_compute_matchable,
    compute_reference_of,
    same_inputs_or_error,
)
from repro.experiments.files import RUN_LIST, read_mapping
from repro.experiments.matching import MATCH_KEY, reference_of

_TOP = {"base", "overrides", "runs"}
_RUN = {"label", "overrides", MATCH_KEY, COMPUTE_KEY}


@dataclass
class RunSpec:
    label: str
    overrides: list[str] = field(default_factory=list)
    match_kept_count_of: str | None = None
    match_compute_of: str | None = None  # the label whose cost (selection + training) this run takes

    @property
    def match_ref(self) -> str | None:
        """The label this run is matched to, in count or in compute (None: it selects on its own)."""
        return self.match_kept_count_of or self.match_compute_of

    @property
    def match_key(self) -> str:
        return COMPUTE_KEY if self.match_compute_of else MATCH_KEY


@dataclass
class RunList:
    base: Path
    overrides: list[str]
    runs: list[RunSpec]
    path: Path | None = None  # the run-list file, for messages


def _override_list(value: object, where: str) -> None:
    """ConfigError unless `value` is null or a list of 'key.sub=value' strings."""
    if value is not None and (not isinstance(value, list) or not all(isinstance(o, str) for o in value)):
        raise ConfigError(f"{where}: expected a list of 'key.sub=value' strings, got {value!r}")


def load_run_list(path: str | Path) -> RunList:
    p = resolve_config_path(path, "run-list file")
    return run_list_from_mapping(read_mapping(p, RUN_LIST), p)


def run_list_from_mapping(data: dict, p: Path) -> RunList:
    """The run list of a file's mapping (base, overrides, runs); ConfigError naming `p`."""
    unknown = set(data) - _TOP
    if unknown:
        raise ConfigError(f"{p}: unknown keys {sorted(unknown)} (allowed: base, overrides, runs)")
    if "base" not in data:
        raise ConfigError(f"{p}: needs 'base' (a config file, relative to this file)")
    if not data.get("runs"):
        raise ConfigError(
            f"{p}: runs: expected a non-empty list of runs (label, overrides), got {data.get('runs')!r}"
        )
    if not isinstance(data["base"], str) or not isinstance(data["runs"], list):
        raise ConfigError(
            f"{p}: 'base' must be a config file name and 'runs' a list of runs, "
            f"got {type(data['base']).__name__} and {type(data['runs']).__name__}"
        )
    _override_list(data.get("overrides"), f"{p}: overrides")
    runs, labels = [], set()
    for i, r in enumerate(data["runs"]):
        if not isinstance(r, dict) or "label" not in r:
            raise ConfigError(f"{p}: runs[{i}] needs a 'label'")
        ref = reference_of(r, f"{p}: runs[{i}]")
        cref = compute_reference_of(r, f"{p}: runs[{i}]")
        extra = set(r) - _RUN
        if extra:
            raise ConfigError(
                f"{p}: runs[{i}] has unknown keys {sorted(extra)} (allowed: {', '.join(sorted(_RUN))})"
            )
        _override_list(r.get("overrides"), f"{p}: runs[{i}].overrides")
        spec = RunSpec(str(r["label"]), [str(o) for o in r.get("overrides") or []], ref, cref)
        if spec.label in labels:
            first = next(j for j, x in enumerate(runs) if x.label == spec.label)
            raise ConfigError(
                f"{p}: runs[{first}] and runs[{i}] are both labelled {spec.label!r}: a label names "
                "one run (its results and any match_kept_count_of follow it); give each run its own label"
            )
        if ref is not None and ref not in labels:
            raise ConfigError(
                f"{p}: runs[{i}] ({spec.label}) matches the kept count of "
                f"{ref!r}, which must be an earlier run's label"
            )
        if cref is not None and cref not in labels:
            raise ConfigError(
                f"{p}: runs[{i}] ({spec.label}): {COMPUTE_KEY}: {cref!r} is not the label of an "
                f"earlier run (earlier labels: {', '.join(sorted(labels)) or 'none'})"
            )
        labels.add(spec.label)
        runs.append(spec)
    return RunList(
        (p.parent / data["base"]).resolve(), [str(o) for o in data.get("overrides") or []], runs, p
    )


def run_configs(rl: RunList, extra: list[str] = ()) -> list[tuple[RunSpec, ExperimentConfig]]:
    """Every run's config (validated up front, so a typo fails before hours of work). A run that
    takes another's kept count has no selection.n yet: its config selects from the whole pool."""
    return [(r, load_config(rl.base, [*rl.overrides, *r.overrides, *extra])) for r in rl.runs]


def preflight_run_list(rl: RunList, extra: list[str] = ()) -> dict[str, list]:
    """Preflight every run (repro/preflight.py); PreflightError naming each run with a problem,
    ConfigError naming two runs that are one experiment (grids.refuse_repeats)."""
    from repro.contracts import unmatchable
    from repro.experiments.grids import refuse_repeats
    from repro.preflight import require_clean

    where = f"{rl.path} " if rl.path else ""
    configs = run_configs(rl, extra)
    by_label = {r.label: cfg for r, cfg in configs}
    for r, cfg in configs:  # a run that cannot take a kept count fails now, not after the others trained
        why = unmatchable(cfg.selection.method, r.match_ref, r.match_key) if r.match_ref else None
        if why:
            raise ConfigError(f"{where}run {r.label}: {r.match_key}: {why}")
        if r.match_compute_of:
            ref = r.match_compute_of
            same_inputs_or_error(cfg, by_label[ref], f"{where}run {r.label}", ref)
            check_compute_matchable(cfg, f"{where}run {r.label}")
    notes = require_clean([(f"{where}run {r.label}", cfg) for r, cfg in configs])
    by = {r.label: "compute" if r.match_compute_of else "kept_count" for r in rl.runs}
    refuse_repeats(  # one experiment, one run: after each run's own problems are named
        [
            (r.label, f"runs[{i}] ({r.label})", cfg, r.match_ref, by[r.label])
            for i, (r, cfg) in enumerate(configs)
        ],
        rl.path or Path("run list"),
    )
    return notes


def run_list(rl: RunList, extra: list[str] = (), force: bool = False) -> list[Path]:
    """Run every experiment of the list in order; returns their run directories (the inline
    executor, experiment.run_in_order, after every run's preflight)."""
    from repro.experiments.inline import run_in_order
    from repro.problems import report

    notes = preflight_run_list(rl, extra)  # validate and check all first
    if any(notes.values()):
        print(report(notes), file=sys.stderr, flush=True)
    return run_in_order(
        [
            (spec.label, cfg, spec.match_ref, "compute" if spec.match_compute_of else "kept_count")
            for spec, cfg in run_configs(rl, extra)
        ],
        where=lambda label: f"{rl.path or 'run list'}: run {label}",
        label_of=lambda ref: ref,
        force=force,
    )
