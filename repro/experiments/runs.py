"""The `runs:` part of an experiment file: labelled runs, each the base config plus its own
settings (the file's format: repro/experiments/experiment.py).

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

A run's config is the base config, the file's `set` and `overrides`, then the run's own `set` and
`overrides`; its cell id is its label, and its `name` stays the base config's. A run matches an
earlier run by label: `match_kept_count_of` (matching.py) is how a baseline is compared at the
same budget as a CluSTER run whose kept count is known only once its clusters are;
`match_compute_of` (compute.py) at the same cost, selection included, once that run has trained.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError, check_name
from repro.core.config.load import from_dict
from repro.experiments.cells import Cell, Declared, apply_overrides, apply_settings, declared
from repro.experiments.compute import COMPUTE_KEY, compute_reference_of
from repro.experiments.matching import MATCH_KEY, reference_of

RUN_KEYS = ("label", "overrides", "set", MATCH_KEY, COMPUTE_KEY)


def plan_runs(
    runs: Any, p: Path, base: dict[str, Any], shared: dict[str, Any], extra: list[tuple[str, Any]]
) -> list[Declared]:
    """The cells of the `runs:` list of the file `p`, each as `declared` (with its validated
    config): `base` (the base config's mapping), then `shared` (the file's `set` and
    `overrides`), then each run's own, then `extra` (the command line's parsed overrides). Every
    config is validated now, before anything runs."""
    from repro.contracts import unmatchable
    from repro.experiments.compute import check_compute_matchable, same_inputs_or_error

    if not isinstance(runs, list) or not runs:
        raise ConfigError(f"{p}: runs: expected a non-empty list of runs (label, overrides), got {runs!r}")
    cells: list[Declared] = []
    by_label: dict[str, tuple[int, Any]] = {}  # label -> (its index, its config)
    for i, r in enumerate(runs):
        where = f"{p}: runs[{i}]"
        if not isinstance(r, dict) or "label" not in r:
            raise ConfigError(f"{where}: expected a mapping with a 'label' (and overrides), got {r!r}")
        ref = reference_of(r, where)
        cref = compute_reference_of(r, where)
        unknown = set(r) - set(RUN_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)} (allowed: {', '.join(RUN_KEYS)})")
        label = r["label"]
        if not isinstance(label, str):
            raise ConfigError(f"{where}.label: expected a string, got {label!r}")
        check_name(label, f"{where}.label")  # the cell id: a job name and a file name of a launch
        if label in by_label:
            raise ConfigError(
                f"{p}: runs[{by_label[label][0]}] and runs[{i}] are both labelled {label!r}: a label "
                "names one run (its results and any match_kept_count_of follow it); give each run "
                "its own label"
            )
        for key, named in ((MATCH_KEY, ref), (COMPUTE_KEY, cref)):
            if named is not None and named not in by_label:
                raise ConfigError(
                    f"{where} ({label}): {key}: {named!r} is not the label of an earlier run "
                    f"(earlier labels: {', '.join(by_label) or 'none'})"
                )
        data = copy.deepcopy(base)
        apply_settings(data, shared, f"{p}:")
        apply_settings(data, r, where)
        apply_overrides(data, extra)
        cfg = from_dict(data, source=f"{where} ({label})")  # a typo fails before anything runs
        match_ref = ref or cref
        key = COMPUTE_KEY if cref else MATCH_KEY
        if match_ref is not None:  # a selector that sets its own count cannot be matched
            why = unmatchable(cfg.selection.method, match_ref, key)
            if why:
                raise ConfigError(f"{where} ({label}): {key}: {why}")
            if cref is not None:
                same_inputs_or_error(cfg, by_label[cref][1], f"{where} ({label})", cref)
                check_compute_matchable(cfg, f"{where} ({label})")
        by_label[label] = (i, cfg)
        axes = {
            "dataset": "+".join(Path(s.path).stem for s in cfg.data.sources),
            "model": cfg.model.name_or_path,
            "method": cfg.selection.method,
            "ratio": cfg.selection.params.get("ratio"),
            "world_size": cfg.world_size,
            "seed": cfg.seed,
            "label": label,
        }
        cell = Cell(label, axes, data, match_ref, {}, "compute" if cref else "kept_count")
        cells.append(declared(cell, f"runs[{i}] ({label})", cfg))
    return cells
