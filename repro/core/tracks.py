"""Tracks: fixed comparisons of selection methods, as data (configs/tracks/*.yaml).

A track names everything but the method, so every comparison on it is comparable:

    track: quick                      # its name (runs are named `track-<name>`)
    version: 1                        # raise it when anything below changes what a run is
    about: one line on what it is
    base: ../demo-quick.yaml          # the training recipe: a config file, relative to this file
    overrides: [train.epochs=1, ...]  # on top of the base
    pool: {source: demo}              # the data sources' paths ('+'-joined), with `sha256` (file
                                      # sources: {path: sha256}) or `revision` (hub sources)
    model: {name: tiny-random-llama}  # model.name_or_path (and `revision`), set on every run
    world_size: 2                     # set on every run
    budgets:                          # kept fractions (or counts `n`); CluSTER runs at
      - {name: 50%, fraction: 0.5}    #   `cluster_ratio` (percent; default 100 x fraction)
    seeds: [0, 1, 2]                  # at least 3
    metrics:
      primary: {name: held-out loss, benchmarks: [heldout], metric: loss, better: lower}
      secondary: [{name: demo tasks, benchmarks: [demo/overall], metric: exact_or_exec}]
    protocol: how the metrics are scored, in words (the eval settings are the config's)
    runs_on: local                    # local (`track run`) or slurm (`track run --cluster slurm`)
    cluster: [allocation.method=cluster-interleave, ...]   # the CluSTER baseline's overrides

Every track runs the same baselines beside a method (`BASELINES`): full data, random at each
budget, CluSTER at each budget with random at its kept count, and random at the compute of each
method's run and of CluSTER's (repro/experiments/compute.py).

`load_track` reads and checks a track (errors name the file and the key); `classify` says where a
run's config sits in a track (its role and budget), and `setting_differences` which of its
training settings differ from the track's: the board, the submissions' check and the planner all
read a run through these two.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from repro.core.config.builder import ConfigError, build, parse_override, read_yaml_file
from repro.core.config.load import SHIPPED_CONFIGS, from_dict
from repro.core.config.schema import ExperimentConfig
from repro.core.sources import is_plugin

TRACKS_DIR = SHIPPED_CONFIGS / "tracks"
RUN_NAME_PREFIX = "track-"
MIN_SEEDS = 3
# What every track runs beside a method, in words (the board's legend and the docs say the same).
BASELINES = (
    "full data",
    "random at each budget's count",
    "CluSTER at each budget, with random at its kept count",
    "random at the compute (selection + training) of each method's run and of CluSTER's",
)
DEFAULT_CLUSTER = ["allocation.method=cluster-interleave", "allocation.weight_mode=rank"]

# Roles of a run in a track (`classify`).
FULL, METHOD, CLUSTER, RANDOM, RANDOM_COUNT, RANDOM_COMPUTE = (
    "full",
    "method",
    "cluster",
    "random",
    "random-count",
    "random-compute",
)


@dataclass
class Budget:
    name: str
    fraction: float | None = None
    n: int | None = None
    cluster_ratio: float | None = None  # CluSTER's r in percent at this budget

    def ratio(self) -> float | None:
        """CluSTER's r (percent) at this budget: cluster_ratio, else 100 x fraction."""
        if self.cluster_ratio is not None:
            return float(self.cluster_ratio)
        return None if self.fraction is None else 100.0 * self.fraction

    def overrides(self) -> list[str]:
        """The selection keys that put a budget-taking selector at this budget."""
        if self.fraction is not None:
            return [f"selection.fraction={self.fraction}", "selection.n=null"]
        return [f"selection.n={self.n}", "selection.fraction=null"]


@dataclass
class PoolSpec:
    source: str  # the data sources' paths joined by '+'
    sha256: dict[str, str] | None = None  # file sources: {path as in the config: sha256}
    revision: str | None = None  # hub sources: the revision every source is pinned to


@dataclass
class ModelSpec:
    name: str
    revision: str | None = None


@dataclass
class MetricSpec:
    """A metric of the track: the mean over `benchmarks` of each one's `metric` (fractions in
    percent, loss and perplexity as they are); `better`: which way is better."""

    name: str
    benchmarks: list[str]
    metric: str
    better: Literal["higher", "lower"] = "higher"

    @property
    def higher_is_better(self) -> bool:
        return self.better == "higher"


@dataclass
class Metrics:
    primary: MetricSpec
    secondary: list[MetricSpec] = field(default_factory=list)


@dataclass
class TrackFile:
    """A track file as written (every key; `Track` adds where it came from)."""

    track: str
    version: int
    about: str
    base: str
    pool: PoolSpec
    model: ModelSpec
    world_size: int
    budgets: list[Budget]
    seeds: list[int]
    metrics: Metrics
    protocol: str
    overrides: list[str] = field(default_factory=list)
    runs_on: Literal["local", "slurm"] = "local"
    cluster: list[str] = field(default_factory=lambda: list(DEFAULT_CLUSTER))


@dataclass
class Track(TrackFile):
    path: Path = Path(".")
    _built: dict[tuple[int, tuple[str, ...]], ExperimentConfig] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def run_name(self) -> str:
        """The config name of every run of the track (its runs' folder under the results)."""
        return RUN_NAME_PREFIX + self.track

    @property
    def base_path(self) -> Path:
        return (self.path.parent / self.base).resolve()

    def overrides_for(self, seed: int) -> list[str]:
        """What every run of the track sets on top of its base, at `seed`."""
        out = [*self.overrides, f"name={self.run_name}", f"world_size={self.world_size}"]
        out += [f"model.name_or_path={self.model.name}", f"seed={seed}"]
        if self.model.revision is not None:
            out.append(f"model.revision={self.model.revision}")
        return out

    @functools.cached_property
    def base_data(self) -> dict[str, Any]:
        data = read_yaml_file(self.base_path, "config file") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{self.path}: base: {self.base_path} is not a config (a YAML mapping)")
        return data

    def config(self, seed: int, extra: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
        """The track's config at `seed` with `extra` overrides (ConfigError naming the track).
        Built once per (seed, extra) in a process; each call returns its own copy."""
        return copy.deepcopy(self._config(seed, tuple(extra)))

    def _config(self, seed: int, extra: tuple[str, ...]) -> ExperimentConfig:
        key = (seed, extra)
        if key not in self._built:
            self._built[key] = from_dict(
                self.base_data, [*self.overrides_for(seed), *extra], source=f"{self.path} (base {self.base})"
            )
        return self._built[key]

    def budget(self, name: str) -> Budget:
        for b in self.budgets:
            if b.name == name:
                return b
        raise ConfigError(f"{self.path}: no budget {name!r} (budgets: {', '.join(self.names())})")

    def names(self) -> list[str]:
        return [b.name for b in self.budgets]

    def digest(self) -> str:
        """12 hex digits of the track as written (every key): what a submission names beside
        the version, so a file edited without a new version is caught too."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrackFile)}
        d = json.loads(json.dumps(d, default=lambda o: dataclasses.asdict(o)))
        return _short(d)


def _short(d: Any) -> str:
    import hashlib

    blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def shipped_tracks() -> list[str]:
    return sorted(p.stem for p in TRACKS_DIR.glob("*.yaml"))


def resolve_track_path(name: str | Path) -> Path:
    """A track file: a path that exists, or a shipped track by name (`quick`, `tracks/quick`,
    `configs/tracks/quick.yaml`)."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    short = p.as_posix().removesuffix(".yaml").removeprefix("configs/").removeprefix("tracks/")
    shipped = TRACKS_DIR / f"{short}.yaml"
    if "/" not in short and shipped.is_file():
        return shipped
    import difflib

    hint = difflib.get_close_matches(short, shipped_tracks(), n=1)
    raise ConfigError(
        f"track {str(name)!r} not found: no such file, nor a shipped track of that name"
        f"{f'; did you mean {hint[0]!r}?' if hint else ''} (shipped: {', '.join(shipped_tracks())})"
    )


def load_track(name: str | Path) -> Track:
    """The track `name` (a file or a shipped track), every key checked: ConfigError naming the
    file and the key, and what was expected."""
    path = resolve_track_path(name)
    data = read_yaml_file(path, "track file") or {}
    raw = build(TrackFile, data, str(path), _validate)
    track = Track(**{f.name: getattr(raw, f.name) for f in dataclasses.fields(TrackFile)}, path=path)
    _check_config(track)
    return track


def _validate(t: TrackFile) -> None:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", t.track):
        raise ConfigError(f"track: {t.track!r}: expected lower-case letters, digits and '-'")
    if t.version < 1:
        raise ConfigError(f"version: expected an integer >= 1, got {t.version}")
    if t.world_size < 1:
        raise ConfigError(f"world_size: expected an integer >= 1, got {t.world_size}")
    if len(set(t.seeds)) != len(t.seeds) or len(t.seeds) < MIN_SEEDS:
        raise ConfigError(
            f"seeds: expected at least {MIN_SEEDS} different seeds (an interval over seeds needs "
            f"them), got {t.seeds}"
        )
    if not t.budgets:
        raise ConfigError("budgets: expected at least one budget ({name, fraction} or {name, n})")
    names = [b.name for b in t.budgets]
    for i, b in enumerate(t.budgets):
        where = f"budgets[{i}] ({b.name})"
        if (b.fraction is None) == (b.n is None):
            raise ConfigError(f"{where}: give exactly one of fraction and n")
        if b.fraction is not None and not 0 < b.fraction < 1:
            raise ConfigError(f"{where}: fraction: expected a number in (0, 1), got {b.fraction}")
        if b.n is not None and b.n < 1:
            raise ConfigError(f"{where}: n: expected a positive integer, got {b.n}")
        if b.fraction is None and b.cluster_ratio is None:
            raise ConfigError(f"{where}: a budget of n examples needs cluster_ratio (CluSTER's r in %)")
        r = b.ratio()
        if r is not None and not 0 < r <= 100:
            raise ConfigError(f"{where}: cluster_ratio: expected a percentage in (0, 100], got {r}")
        if names.count(b.name) > 1:
            raise ConfigError(f"{where}: two budgets are named {b.name!r}")
    if len({b.ratio() for b in t.budgets}) != len(t.budgets):
        raise ConfigError("budgets: two budgets give CluSTER the same cluster_ratio")
    for i, m in enumerate([t.metrics.primary, *t.metrics.secondary]):
        where = "metrics.primary" if i == 0 else f"metrics.secondary[{i - 1}]"
        if not m.benchmarks:
            raise ConfigError(f"{where}.benchmarks: expected at least one benchmark")
    for key, ovs in (("overrides", t.overrides), ("cluster", t.cluster)):
        for j, o in enumerate(ovs):
            k, _ = parse_override(o)
            if key == "overrides" and k.split(".")[0] in ("seed", "name", "world_size", "selection"):
                raise ConfigError(
                    f"overrides[{j}]: {o!r}: the track sets {k.split('.')[0]} itself "
                    "(seeds, world_size, the budgets; the name is track-<track>)"
                )
            if key == "cluster" and not k.startswith(("selection.params.", "allocation.")):
                raise ConfigError(
                    f"cluster[{j}]: {o!r}: expected selection.params.* or allocation.* "
                    "(CluSTER's own settings; training settings are the track's)"
                )


def _check_config(track: Track) -> None:
    """The base + overrides load as a config, and its data sources are the track's pool."""
    try:
        cfg = track.config(track.seeds[0])
    except ConfigError as e:
        raise ConfigError(f"{track.path}: base / overrides: {e}") from None
    sources = "+".join(s.path for s in cfg.data.sources)
    if sources != track.pool.source:
        raise ConfigError(
            f"{track.path}: pool.source: {track.pool.source!r}, but the config's data.sources are "
            f"{sources!r} (base {track.base} with the overrides)"
        )
    paths = [s.path for s in cfg.data.sources if not is_plugin(s.path) and not s.path.startswith("hf:")]
    paths += [s.exclude_ids_file for s in cfg.data.sources if s.exclude_ids_file]
    said = track.pool.sha256 or {}
    missing = [p for p in paths if p not in said]
    if missing:
        raise ConfigError(
            f"{track.path}: pool.sha256: expected a sha256 for each data file, missing {missing}"
        )
    hub = [s for s in cfg.data.sources if s.path.startswith("hf:")]
    if hub and (track.pool.revision is None or any(s.revision != track.pool.revision for s in hub)):
        raise ConfigError(
            f"{track.path}: pool.revision: the hub sources must be pinned to it (data.sources[].revision), "
            f"got {[s.revision for s in hub]} against {track.pool.revision!r}"
        )


# ----------------------------------------------------------------------------- reading runs

# Config keys a method and its baselines may set differently from the track (the selection, the
# allocation, the seeds and where things live); every other key is the track's training setting.
_FREE = (
    "name",
    "output_dir",
    "data_dir",
    "launch",
    "seed",
    "selection_seed",
    "training_seed",
    "selection",
    "allocation",
    "train.report_to",
    "eval.batch_size",
    "eval.workers",
)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _free(key: str) -> bool:
    return any(key == f or key.startswith(f + ".") for f in _FREE)


def setting_differences(track: Track, config: dict[str, Any]) -> list[str]:
    """The training settings in which a run's stored config differs from the track's, each as
    `key (run A, track B)` (empty: the run is of this track). The model name, world size and
    every key of the recipe count; the selection, allocation, seeds and paths do not."""
    try:
        cfg = from_dict(copy.deepcopy(config), source="the run's config")
    except ConfigError as e:
        return [f"its config does not load here ({e})"]
    return _differences(track, cfg)


def _differences(track: Track, cfg: ExperimentConfig) -> list[str]:
    want = _flat(track._config(cfg.seed, ()).to_dict())
    have = _flat(cfg.to_dict())
    out = []
    for k in sorted(set(want) | set(have)):
        if _free(k):
            continue
        a, b = have.get(k, "unset"), want.get(k, "unset")
        if json.dumps(a, default=str, sort_keys=True) != json.dumps(b, default=str, sort_keys=True):
            out.append(f"{k} (run {json.dumps(a, default=str)}, track {json.dumps(b, default=str)})")
    if cfg.seed not in track.seeds:
        out.append(f"seed (run {cfg.seed}, track {track.seeds})")
    return out


@dataclass(frozen=True)
class Place:
    """Where a run sits in a track: its role, its budget (None for full data, and for a matched
    random run until its reference is known: `of_run` names that run) and its method label."""

    role: str
    budget: str | None
    label: str
    of_run: str | None = None  # the run id a matched random run takes its count or compute of


def method_label(method: str, params: dict[str, Any]) -> str:
    """A method as the board names it: the selector and its non-default parameters."""
    extra = ", ".join(f"{k}={params[k]}" for k in sorted(params))
    return f"{method} ({extra})" if extra else method


def _same(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(float(a) - float(b)) < 1e-9


def cluster_overrides(track: Track, budget: Budget) -> list[str]:
    """The overrides of the CluSTER baseline at `budget` (on top of the track's config)."""
    return ["selection.method=cluster", f"selection.params.ratio={budget.ratio():g}", *track.cluster]


def classify(track: Track, config: dict[str, Any]) -> Place | None:
    """The place of a run (its stored config) in `track`, or None when it is none of the
    track's cells (a budget the track does not have, CluSTER in another setting than the
    track's, a run matched to something other than random)."""
    try:
        cfg = from_dict(copy.deepcopy(config), source="the run's config")
    except ConfigError:
        return None
    return _classify(track, cfg)


def place(track: Track, config: dict[str, Any]) -> tuple[list[str], Place | None]:
    """(setting_differences, classify) of a run's stored config, read once."""
    try:
        cfg = from_dict(copy.deepcopy(config), source="the run's config")
    except ConfigError as e:
        return [f"its config does not load here ({e})"], None
    differs = _differences(track, cfg)
    return differs, (None if differs else _classify(track, cfg))


def _classify(track: Track, cfg: ExperimentConfig) -> Place | None:
    from repro.core.config.schema import canonical_params

    sel = cfg.selection
    params, _ = canonical_params(cfg)
    rec = sel.matched if isinstance(sel.matched, dict) else None
    if sel.method == "full":
        return Place(FULL, None, "full data")
    if rec is not None:
        if sel.method != "random":
            return None
        role = RANDOM_COMPUTE if rec.get("by") == "compute" else RANDOM_COUNT
        return Place(role, None, "random", of_run=str(rec.get("run_id")))
    if sel.method == "cluster":
        for b in track.budgets:
            want = track._config(cfg.seed, tuple(cluster_overrides(track, b)))
            if (
                canonical_params(want) == (params, canonical_params(cfg)[1])
                and want.allocation == cfg.allocation
            ):
                return Place(CLUSTER, b.name, "CluSTER")
        return None
    for b in track.budgets:
        if (b.fraction is not None and _same(sel.fraction, b.fraction)) or (
            b.n is not None and sel.n == b.n and sel.fraction is None
        ):
            if sel.method == "random":
                return Place(RANDOM, b.name, "random")
            label = method_label(sel.method, params)
            if (
                cfg.allocation != track._config(cfg.seed, ()).allocation
            ):  # its own allocator: part of its name
                label += f" + {cfg.allocation.method} ({cfg.allocation.weight_mode} weights)"
            return Place(METHOD, b.name, label)
    return None
