"""Grid files: datasets x models x methods x ratios x world sizes x seeds, with exclusions.

A grid expands into cells; a cell is one experiment config (`repro/core/config/`), built from the
grid's base config plus the overrides of its dataset, model and method, and its ratio, world size
and seed. `cluster-repro launch` submits a grid's cells (slurm/), `cluster-repro status` shows
where they stand; run lists (runlists.py) are the small, sequential form `cluster-repro grid`
runs. The format (every shipped grid under `configs/grids/` is an example):

    name: paper                          # names the launch folder and the cells' run names
    base: ../paper/recipe.yaml           # a config file, relative to this file
    overrides: [eval.limit=null]         # `key.sub=value` strings, for every cell (optional)
    set: {data.heldout_fraction: 0.0}    # the same, as YAML values (lists, mappings) (optional)
    datasets:                            # each entry: overrides / set, and for the dry-run's
      magicoder:                         # estimate its row count and mean tokens per example
        set: {data.sources: [{path: "hf:ise-uiuc/Magicoder-OSS-Instruct-75K", format: magicoder}]}
        rows: 75197
        tokens_per_example: 520
    models:
      codellama-python-7b: {overrides: [model.name_or_path=codellama/CodeLlama-7b-Python-hf],
                            params_b: 6.74,   # billions of parameters, for the estimate
                            hidden_size: 4096}  # the feature dimension (disk, clustering memory)
    methods:
      full: {overrides: [selection.method=full]}
      cluster: {overrides: [selection.method=cluster, ...], ratios: [100, 75, 50]}
      random: {overrides: [selection.method=random], match_kept_count_of: cluster}
    world_sizes: [4, 8]
    seeds: [42]
    exclude:                             # a cell matching every key of one rule is dropped
      - {dataset: medinstruct, model: [codellama-python-7b, codellama-python-13b]}
      - {world_size: 8, model: codellama-python-13b}
    estimate: {cluster_kept_at_r100: 0.79}   # dry-run assumptions (see slurm/plan.py)

`ratios` makes the ratio axis (`selection.params.ratio`, in percent) for that method only.
`match_kept_count_of: cluster` runs the method once per ratio of `cluster`, at exactly the kept
count that the `cluster` cell of the same dataset, model, world size and seed ends up with (known
only after its clustering: the launcher makes the matched cell wait for it; matching.py).
`match_compute_of: cluster` does the same at the kept count whose training plus selection costs
what that cell's did, in device-seconds (compute.py; its cell waits for that cell's job, and the
dry run shows the count the plan's costs give).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core.config.builder import (
    ConfigError,
    check_name,
    check_text,
    parse_override,
    read_yaml_file,
    set_dotted,
)
from repro.core.config.load import from_dict, resolve_config_path
from repro.core.config.schema import ExperimentConfig
from repro.experiments.compute import COMPUTE_KEY, compute_reference_of
from repro.experiments.files import GRID_FILE, read_mapping
from repro.experiments.matching import MATCH_KEY, reference_of
from repro.experiments.sharing import feature_key as config_feature_key
from repro.experiments.sharing import feature_pass

AXES = ("dataset", "model", "method", "ratio", "world_size", "seed")
_TOP = {
    "name",
    "base",
    "overrides",
    "set",
    "datasets",
    "models",
    "methods",
    "world_sizes",
    "seeds",
    "exclude",
    "estimate",
}
_ENTRY = {"overrides", "set"}
_DATASET = _ENTRY | {"rows", "tokens_per_example"}
_MODEL = _ENTRY | {"params_b", "hidden_size"}
_METHOD = _ENTRY | {"ratios", MATCH_KEY, COMPUTE_KEY}


@dataclass
class Cell:
    """One experiment of a grid: its axes, its config, and what it waits for."""

    id: str  # e.g. magicoder.codellama-python-7b.cluster-r50.ws4.s42
    axes: dict[str, Any]
    data: dict[str, Any]  # the config as a mapping (before selection.n of a matched method)
    match_of: str | None = None  # id of the cell whose kept count (or compute) this one takes
    estimate: dict[str, Any] = field(default_factory=dict)  # rows, tokens_per_example, params_b
    match_by: str = "kept_count"  # or "compute" (match_compute_of: compute.py)

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
class Grid:
    name: str
    path: Path
    cells: list[Cell]
    estimate: dict[str, Any]


Declared = tuple[str, str, ExperimentConfig, str | None, str]


def declared(c: Cell, named: str) -> Declared:
    """A cell as `refuse_repeats` takes it; `named`: how a message names it."""
    return (c.id, named, c.check_config(), c.match_of, c.match_by)


def grid_cell_name(c: Cell) -> str:
    return f"grid cell {c.id} (methods.{c.axes['method']})"


def refuse_repeats(entries: list[Declared], path: Path) -> None:
    """ConfigError naming both declarations when two entries are one experiment. An entry: (id,
    how a message names it, its config before any match, the id of the entry it is matched to or
    None, "kept_count" or "compute"). Unmatched entries are one experiment when their config
    hashes are (the run folder's key: what trains); matched ones, whose final config is known
    only once their reference has run, when their configs before the match are and they match
    the same experiment the same way."""
    by_id = {e[0]: e for e in entries}
    keys: dict[str, tuple] = {}

    def key_of(eid: str) -> tuple:
        if eid not in keys:
            _, _, cfg, ref, by = by_id[eid]
            keys[eid] = (cfg.hash(),) if ref is None else (cfg.hash(), by, key_of(ref))
        return keys[eid]

    first: dict[tuple, Declared] = {}
    for e in entries:
        k = key_of(e[0])
        if k in first:
            how = " before the match, matched to the same reference" if e[3] is not None else ""
            raise ConfigError(
                f"{path}: {first[k][1]} and {e[1]} are the same experiment (config hash "
                f"{k[0]}{how}): one config trains once, and its seeds are its replicates. Names, "
                "paths and eval settings are not part of what trains; remove one, or make them "
                "differ in what they train"
            )
        first[k] = e


def _overrides_and_set(entry: dict[str, Any], where: str) -> tuple[list[str], dict[str, Any]]:
    ov = entry.get("overrides") or []
    st = entry.get("set") or {}
    if not isinstance(ov, list) or not all(isinstance(o, str) for o in ov):
        raise ConfigError(f"{where}.overrides: expected a list of 'key.sub=value' strings")
    if not isinstance(st, dict):
        raise ConfigError(f"{where}.set: expected a mapping of dotted keys to values")
    return ov, st


def _set_dotted(data: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    set_dotted(data, dotted, copy.deepcopy(value), f"{where}:")


def _entries(data: dict[str, Any], key: str, allowed: set[str], where: str) -> dict[str, dict]:
    raw = data.get(key)
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: '{key}' must be a non-empty mapping of name -> settings")
    out = {}
    for name, entry in raw.items():
        entry = entry or {}
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: {key}.{name}: expected a mapping, got {entry!r}")
        if MATCH_KEY in allowed:  # methods: the key's one spelling (matching.py)
            reference_of(entry, f"{where}: {key}.{name}")
            compute_reference_of(entry, f"{where}: {key}.{name}")
        extra = set(entry) - allowed
        if extra:
            raise ConfigError(
                f"{where}: {key}.{name}: unknown keys {sorted(extra)} (allowed: {', '.join(sorted(allowed))})"
            )
        if not str(name).replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"{where}: {key}.{name}: names may hold letters, digits, - and _")
        out[str(name)] = entry
    return out


def _int_list(data: dict[str, Any], key: str, where: str) -> list[int]:
    v = data.get(key)
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{where}: '{key}' must be a non-empty list of integers, got {v!r}")
    _no_repeats(v, f"{where}: {key}")
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


def load_grid(path: str | Path, extra: list[str] | tuple[str, ...] = ()) -> Grid:
    """Read a grid file and expand it into cells (each config validated now, not in a job)."""
    p = resolve_config_path(path, "grid file")
    return grid_from_mapping(read_mapping(p, GRID_FILE), p, extra)


def grid_from_mapping(g: dict[str, Any], p: Path, extra: list[str] | tuple[str, ...] = ()) -> Grid:
    """The grid of a file's mapping, expanded into cells; ConfigError naming `p`."""
    unknown = set(g) - _TOP
    if unknown:
        raise ConfigError(f"{p}: unknown keys {sorted(unknown)} (allowed: {', '.join(sorted(_TOP))})")
    for key in ("name", "base"):
        if not isinstance(g.get(key), str):
            raise ConfigError(f"{p}: '{key}' is required (a string)")
    try:  # the name becomes the launch folder and starts every job name (an sbatch line)
        check_name(g["name"], "name")
        check_text(g["base"], "base")
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
    base_path = (p.parent / g["base"]).resolve()
    if not base_path.is_file():
        raise ConfigError(f"{p}: base config {g['base']!r} not found (looked at {base_path})")
    base = read_yaml_file(base_path, "base config") or {}
    top_ov, top_set = _overrides_and_set(g, str(p))
    datasets = _entries(g, "datasets", _DATASET, str(p))
    models = _entries(g, "models", _MODEL, str(p))
    methods = _entries(g, "methods", _METHOD, str(p))
    world_sizes = _int_list(g, "world_sizes", str(p))
    seeds = _int_list(g, "seeds", str(p))
    rules = g.get("exclude") or []
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ConfigError(f"{p}: 'exclude' must be a list of mappings (axis: value or [values])")
    for i, rule in enumerate(rules):
        bad = set(rule) - set(AXES)
        if bad:
            raise ConfigError(
                f"{p}: exclude[{i}] has unknown axes {sorted(bad)} (allowed: {', '.join(AXES)})"
            )
    matches = {
        name: reference_of(m, f"{p}: methods.{name}") or compute_reference_of(m, f"{p}: methods.{name}")
        for name, m in methods.items()
    }
    match_key = {name: COMPUTE_KEY if m.get(COMPUTE_KEY) else MATCH_KEY for name, m in methods.items()}
    for name, m in methods.items():
        if "ratios" in m and (not isinstance(m["ratios"], list) or not m["ratios"]):
            raise ConfigError(
                f"{p}: methods.{name}.ratios: expected a non-empty list of percents, got "
                f"{m['ratios']!r}; leave the key out for one cell at the config's own ratio"
            )
        if isinstance(m.get("ratios"), list):
            _no_repeats(m["ratios"], f"{p}: methods.{name}.ratios")
        for r in m.get("ratios") or []:
            if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 < r <= 100:
                raise ConfigError(
                    f"{p}: methods.{name}.ratios: {r!r} is not a ratio: expected "
                    "numbers in (0, 100], in percent (the paper's r = 0.5 is 50)"
                )
        ref = matches[name]
        if ref is None:
            continue
        where = f"{p}: methods.{name}.{match_key[name]}"
        if ref not in methods:
            raise ConfigError(
                f"{where}: {ref!r} is not a method of this grid (methods: {', '.join(methods)})"
            )
        if m.get("ratios"):
            raise ConfigError(
                f"{p}: methods.{name}: {match_key[name]} takes the ratios of the matched "
                "method; do not give 'ratios' too"
            )
        if matches[ref]:
            raise ConfigError(
                f"{where}: {ref!r} itself matches another method; match a method that selects on its own"
            )

    extra_pairs = [parse_override(o) for o in extra]
    for k, _ in extra_pairs:
        if k in ("world_size", "seed", "name", "selection.params.ratio"):
            raise ConfigError(
                f"override {k}: this is an axis of the grid; change the grid file or pick cells with --only"
            )
    cells: list[Cell] = []
    cells_by_id: dict[str, Cell] = {}
    ids: dict[str, dict[str, Any]] = {}  # cell id -> its axes (to name both of a collision)
    order = [n for n in methods if not matches[n]] + [n for n in methods if matches[n]]
    for ds, model, ws, seed in itertools.product(datasets, models, world_sizes, seeds):
        for mname in order:
            m = methods[mname]
            ref = matches[mname]
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
                if cid in ids:
                    raise ConfigError(
                        f"{p}: two cells are both {cid} (one run folder): {ids[cid]} and {axes}; "
                        "rename a method or drop the repeated value"
                    )
                match_of = f"{ds}.{model}.{ref}{_ratio_label(r)}.ws{ws}.s{seed}" if ref else None
                if match_of is not None and match_of not in ids:
                    raise ConfigError(
                        f"{p}: cell {cid} takes the kept count of {match_of}, "
                        "which the exclusions drop; exclude both or neither"
                    )
                data = copy.deepcopy(base)
                for k, v in top_set.items():
                    _set_dotted(data, k, v, f"{p}: set")
                for o in top_ov:
                    _set_dotted(data, *parse_override(o), f"{p}: overrides")
                for entry, ew in (
                    (datasets[ds], f"datasets.{ds}"),
                    (models[model], f"models.{model}"),
                    (m, f"methods.{mname}"),
                ):
                    ov, st = _overrides_and_set(entry, f"{p}: {ew}")
                    for k, v in st.items():
                        _set_dotted(data, k, v, f"{p}: {ew}.set")
                    for o in ov:
                        _set_dotted(data, *parse_override(o), f"{p}: {ew}.overrides")
                if r is not None and not ref:  # a matched method takes a count, not a ratio
                    _set_dotted(data, "selection.params.ratio", r, f"{p}: ratios")
                for k, v in extra_pairs:
                    _set_dotted(data, k, v, "command line")
                data["world_size"] = ws
                data["seed"] = seed
                data["name"] = cid  # not the grid name: grids that hold the same cell share its run
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
                cell.check_config()  # validated now: a typo fails before anything is submitted
                if match_of is not None:  # a selector that sets its own count cannot be matched
                    from repro.contracts import unmatchable

                    why = unmatchable(cell.check_config().selection.method, ref or "", match_key[mname])
                    if why:
                        raise ConfigError(f"{p}: methods.{mname}.{match_key[mname]}: {why}")
                    if cell.match_by == "compute":
                        from repro.experiments.compute import check_compute_matchable, same_inputs_or_error

                        check_compute_matchable(cell.check_config(), f"{p}: methods.{mname}")

                        same_inputs_or_error(
                            cell.check_config(),
                            from_dict(cells_by_id[match_of].data, source=f"cell {match_of}"),
                            f"{p}: methods.{mname}",
                            ref or "",
                        )
                cells.append(cell)
                cells_by_id[cid] = cell
                ids[cid] = axes
    if not cells:
        raise ConfigError(f"{p}: the exclusions leave no cell")
    refuse_repeats([declared(c, grid_cell_name(c)) for c in cells], p)
    estimate = g.get("estimate") or {}
    if not isinstance(estimate, dict):
        raise ConfigError(f"{p}: 'estimate' must be a mapping of dry-run assumptions, got {estimate!r}")
    return Grid(g["name"], p, cells, dict(estimate))


def select_cells(grid: Grid, only: list[str]) -> list[Cell]:
    """Cells whose axes match every `axis=value[,value]` filter (`--only`), plus what they match."""
    filters: dict[str, set[str]] = {}
    for f in only:
        if "=" not in f:
            raise ConfigError(f"--only {f!r}: expected axis=value (axes: {', '.join(AXES)}, or id)")
        k, v = f.split("=", 1)
        if k not in (*AXES, "id"):
            raise ConfigError(f"--only {f!r}: unknown axis {k!r} (axes: {', '.join(AXES)}, or id)")
        filters.setdefault(k, set()).update(v.split(","))
    keep = [
        c
        for c in grid.cells
        if all(str(c.id if k == "id" else c.axes.get(k)) in vs for k, vs in filters.items())
    ]
    need = {c.match_of for c in keep if c.match_of}
    return [c for c in grid.cells if c in keep or c.id in need] if need else keep
