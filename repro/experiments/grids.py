"""The `grid:` part of an experiment file: datasets x models x methods x ratios x world sizes x
seeds, minus exclusions (the file's format: repro/experiments/experiment.py).

    grid:
      datasets:                          # each entry: overrides / set, and for the dry run's
        magicoder:                       # estimate its row count and mean tokens per example
          set: {data.sources: [{path: "hf:ise-uiuc/Magicoder-OSS-Instruct-75K", format: magicoder}]}
          rows: 75197
          tokens_per_example: 520
      models:
        codellama-python-7b: {overrides: [model.name_or_path=codellama/CodeLlama-7b-Python-hf],
                              params_b: 6.74,     # billions of parameters, for the estimate
                              hidden_size: 4096}  # the feature dimension (disk, clustering memory)
      methods:
        full: {overrides: [selection.method=full]}
        cluster: {overrides: [selection.method=cluster, ...], ratios: [100, 75, 50]}
        random: {overrides: [selection.method=random], match_kept_count_of: cluster}
      world_sizes: [4, 8]
      seeds: [42]
      exclude:                           # a cell matching every key of one rule is dropped
        - {dataset: medinstruct, model: [codellama-python-7b, codellama-python-13b]}
        - {world_size: 8, model: codellama-python-13b}

A cell's config is the base config, the file's `set` and `overrides`, then those of its dataset,
model and method, its ratio, world size and seed; its `name` is its id, so two files that hold
the same cell share its run folder. `ratios` makes the ratio axis (`selection.params.ratio`, in
percent) for that method only. `match_kept_count_of: cluster` runs the method once per ratio of
`cluster`, at exactly the kept count that the `cluster` cell of the same dataset, model, world
size and seed ends up with (known only after its clustering: the matched cell waits for it;
matching.py). `match_compute_of: cluster` does the same at the kept count whose training plus
selection costs what that cell's did, in device-seconds (compute.py).
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError, set_dotted
from repro.core.config.load import from_dict
from repro.experiments.cells import AXES, Cell, Declared, apply_overrides, apply_settings, declared
from repro.experiments.compute import COMPUTE_KEY, compute_reference_of
from repro.experiments.matching import MATCH_KEY, reference_of

GRID_KEYS = ("datasets", "models", "methods", "world_sizes", "seeds", "exclude")
_ENTRY = {"overrides", "set"}
_DATASET = _ENTRY | {"rows", "tokens_per_example"}
_MODEL = _ENTRY | {"params_b", "hidden_size"}
_METHOD = _ENTRY | {"ratios", MATCH_KEY, COMPUTE_KEY}
# Settings a grid cell takes from its axes: the command line may not change them.
AXIS_KEYS = ("world_size", "seed", "name", "selection.params.ratio")


def grid_cell_name(c: Cell) -> str:
    """How a message names a grid cell."""
    return f"grid cell {c.id} (methods.{c.axes['method']})"


def _entries(grid: dict[str, Any], key: str, allowed: set[str], where: str) -> dict[str, dict]:
    raw = grid.get(key)
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}.{key}: expected a non-empty mapping of name -> settings, got {raw!r}")
    out = {}
    for name, entry in raw.items():
        entry = entry or {}
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}.{key}.{name}: expected a mapping, got {entry!r}")
        if MATCH_KEY in allowed:  # methods: the key's one spelling (matching.py)
            reference_of(entry, f"{where}.{key}.{name}")
            compute_reference_of(entry, f"{where}.{key}.{name}")
        extra = set(entry) - allowed
        if extra:
            raise ConfigError(
                f"{where}.{key}.{name}: unknown keys {sorted(extra)} (allowed: {', '.join(sorted(allowed))})"
            )
        if not str(name).replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"{where}.{key}.{name}: names may hold letters, digits, - and _")
        out[str(name)] = entry
    return out


def _int_list(grid: dict[str, Any], key: str, where: str) -> list[int]:
    v = grid.get(key)
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{where}.{key}: expected a non-empty list of integers, got {v!r}")
    _no_repeats(v, f"{where}.{key}")
    return v


def _no_repeats(values: list[Any], where: str) -> None:
    """ConfigError naming both positions when two values of an axis are equal (50 and 50.0 are
    one ratio, as the selector takes them): they would plan one experiment twice."""
    for j, x in enumerate(values):
        for i in range(j):
            if values[i] == x:
                raise ConfigError(
                    f"{where}: [{i}] = {values[i]!r} and [{j}] = {x!r} are the same value, so "
                    "the grid would plan the same cells twice (one run folder, two jobs); "
                    "remove one"
                )


def _ratio_label(r: float | None) -> str:
    if r is None:
        return ""
    return f"-r{int(r) if float(r).is_integer() else r}"


def _excluded(axes: dict[str, Any], rules: list[dict[str, Any]]) -> bool:
    for rule in rules:
        if all(axes.get(k) in (v if isinstance(v, list) else [v]) for k, v in rule.items()):
            return True
    return False


def _methods(methods: dict[str, dict], where: str) -> tuple[dict[str, str | None], dict[str, str]]:
    """Each method's reference (the method whose kept count or compute it takes, or None) and the
    key that names it; ConfigError for bad ratios and references."""
    matches = {
        name: reference_of(m, f"{where}.methods.{name}") or compute_reference_of(m, f"{where}.methods.{name}")
        for name, m in methods.items()
    }
    match_key = {name: COMPUTE_KEY if m.get(COMPUTE_KEY) else MATCH_KEY for name, m in methods.items()}
    for name, m in methods.items():
        if "ratios" in m and (not isinstance(m["ratios"], list) or not m["ratios"]):
            raise ConfigError(
                f"{where}.methods.{name}.ratios: expected a non-empty list of percents, got "
                f"{m['ratios']!r}; leave the key out for one cell at the config's own ratio"
            )
        if isinstance(m.get("ratios"), list):
            _no_repeats(m["ratios"], f"{where}.methods.{name}.ratios")
        for r in m.get("ratios") or []:
            if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 < r <= 100:
                raise ConfigError(
                    f"{where}.methods.{name}.ratios: {r!r} is not a ratio: expected "
                    "numbers in (0, 100], in percent (the paper's r = 0.5 is 50)"
                )
        ref = matches[name]
        if ref is None:
            continue
        at = f"{where}.methods.{name}.{match_key[name]}"
        if ref not in methods:
            raise ConfigError(f"{at}: {ref!r} is not a method of this grid (methods: {', '.join(methods)})")
        if m.get("ratios"):
            raise ConfigError(
                f"{where}.methods.{name}: {match_key[name]} takes the ratios of the matched "
                "method; do not give 'ratios' too"
            )
        if matches[ref]:
            raise ConfigError(
                f"{at}: {ref!r} itself matches another method; match a method that selects on its own"
            )
    return matches, match_key


def plan_grid(
    grid: Any, p: Path, base: dict[str, Any], shared: dict[str, Any], extra: list[tuple[str, Any]]
) -> list[Declared]:
    """The cells of the `grid:` mapping of the file `p`, each as `declared` (with its validated
    config): `base` (the base config's mapping), then `shared` (the file's `set` and
    `overrides`), then each cell's own settings, then `extra` (the command line's parsed
    overrides). Every config is validated now, before anything runs."""
    where = f"{p}: grid"
    if not isinstance(grid, dict):
        raise ConfigError(f"{where}: expected a mapping of axes ({', '.join(GRID_KEYS)}), got {grid!r}")
    unknown = set(grid) - set(GRID_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {sorted(unknown)} (allowed: {', '.join(GRID_KEYS)}; "
            "name, base, overrides, set and estimate belong at the top of the file)"
        )
    datasets = _entries(grid, "datasets", _DATASET, where)
    models = _entries(grid, "models", _MODEL, where)
    methods = _entries(grid, "methods", _METHOD, where)
    world_sizes = _int_list(grid, "world_sizes", where)
    seeds = _int_list(grid, "seeds", where)
    rules = grid.get("exclude") or []
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ConfigError(
            f"{where}.exclude: expected a list of mappings (axis: value or [values]), got {rules!r}"
        )
    for i, rule in enumerate(rules):
        bad = set(rule) - set(AXES)
        if bad:
            raise ConfigError(
                f"{where}.exclude[{i}]: unknown axes {sorted(bad)} (allowed: {', '.join(AXES)})"
            )
    matches, match_key = _methods(methods, where)
    for k, _ in extra:
        if k in AXIS_KEYS:
            raise ConfigError(
                f"override {k}: this is an axis of the grid ({p}); change the file or pick cells with --only"
            )
    cells: list[Declared] = []
    by_id: dict[str, Cell] = {}
    order = [n for n in methods if not matches[n]] + [n for n in methods if matches[n]]
    for ds, model, ws, seed in itertools.product(datasets, models, world_sizes, seeds):
        for mname in order:
            m, ref = methods[mname], matches[mname]
            ratios = (methods[ref].get("ratios") if ref else m.get("ratios")) or [None]
            for r in ratios:
                axes = {
                    "dataset": ds,
                    "model": model,
                    "method": mname,
                    "ratio": r,
                    "world_size": ws,
                    "seed": seed,
                }
                if _excluded(axes, rules):
                    continue
                cid = f"{ds}.{model}.{mname}{_ratio_label(r)}.ws{ws}.s{seed}"
                if cid in by_id:
                    raise ConfigError(
                        f"{where}: two cells are both {cid} (one run folder): {by_id[cid].axes} and {axes}; "
                        "rename a method or drop the repeated value"
                    )
                match_of = f"{ds}.{model}.{ref}{_ratio_label(r)}.ws{ws}.s{seed}" if ref else None
                if match_of is not None and match_of not in by_id:
                    raise ConfigError(
                        f"{where}: cell {cid} takes the kept count of {match_of}, "
                        "which the exclusions drop; exclude both or neither"
                    )
                data = copy.deepcopy(base)
                apply_settings(data, shared, f"{p}:")
                apply_settings(data, datasets[ds], f"{where}.datasets.{ds}")
                apply_settings(data, models[model], f"{where}.models.{model}")
                apply_settings(data, m, f"{where}.methods.{mname}")
                if r is not None and not ref:  # a matched method takes a count, not a ratio
                    set_dotted(data, "selection.params.ratio", r, f"{where}.methods.{mname}.ratios:")
                apply_overrides(data, extra)
                data["world_size"] = ws
                data["seed"] = seed
                data["name"] = cid  # not the file's name: files that hold the same cell share its run
                cell = Cell(
                    cid,
                    axes,
                    data,
                    match_of,
                    {
                        "rows": datasets[ds].get("rows"),
                        "tokens_per_example": datasets[ds].get("tokens_per_example"),
                        "params_b": models[model].get("params_b"),
                        "hidden_size": models[model].get("hidden_size"),
                    },
                    "compute" if ref and match_key[mname] == COMPUTE_KEY else "kept_count",
                )
                cfg = from_dict(data, source=f"{where}: cell {cid}")  # a typo fails before anything runs
                if ref is not None:
                    _check_matchable(
                        cell, cfg, by_id[match_of].data, f"{where}.methods.{mname}", ref, match_key[mname]
                    )
                cells.append(declared(cell, grid_cell_name(cell), cfg))
                by_id[cid] = cell
    if not cells:
        raise ConfigError(f"{where}.exclude: the exclusions leave no cell")
    return cells


def _check_matchable(cell: Cell, cfg: Any, ref_data: dict[str, Any], where: str, ref: str, key: str) -> None:
    """ConfigError when the cell's selector cannot take its reference's kept count (it sets its
    own) or compute (its own cost is unknown, or its model and data are not the reference's)."""
    from repro.contracts import unmatchable

    why = unmatchable(cfg.selection.method, ref, key)
    if why:
        raise ConfigError(f"{where}.{key}: {why}")
    if cell.match_by == "compute":
        from repro.experiments.compute import check_compute_matchable, same_inputs_or_error

        check_compute_matchable(cfg, where)
        same_inputs_or_error(cfg, from_dict(ref_data, source=f"cell {cell.match_of}"), where, ref)
