"""A track and a method as the suite's experiment: labelled runs, the missing ones run.

`cells(track, method)` lists every run a comparison on the track needs, in the order they can
run (a matched run after the run it matches; every random run of a seed before any compute
match, so the per-token cost a compute match reads is the same on every invocation):

    full-s<seed>                                  full data
    random-<budget>-s<seed>                       random at the budget's count
    cluster-<budget>-s<seed>                      CluSTER at the budget's r (the track's settings)
    random-count-of-cluster-<budget>-s<seed>      random at CluSTER's kept count
    <method>-<budget>-s<seed>                     the method at the budget's count
    random-compute-of-cluster-<budget>-s<seed>    random at CluSTER's compute (selection + training)
    random-compute-of-<method>-<budget>-s<seed>   random at the method's compute

Every run is named `track-<track>`, so the baselines of one track share run folders (a run is
its config's hash) whatever method they are compared with: a second method trains only its own
cells and its compute-matched random runs. `states` says which cells the store holds (their
results current for the track's eval settings); `run` runs the rest through the experiment
layer's runner (repro/experiments/inline.py `run_in_order`, with `resolve_match` for a matched
run whose reference is already in the store), and never opens a finished run's folder.
`launch_cells` picks the cells that `run_list_mapping` hands to the launcher as an experiment
file (`track run --cluster slurm`): the missing ones, and the finished runs they are matched to.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError, parse_override
from repro.core.config.schema import ExperimentConfig
from repro.core.io import read_json
from repro.core.tracks import Budget, Track, cluster_overrides

BASELINE_NAMES = ("full", "random", "cluster")


@dataclass
class TrackCell:
    """One run of a track comparison: its label, its overrides on the track's config at `seed`,
    and the run whose kept count ("kept_count") or compute ("compute") it takes."""

    label: str
    role: str  # full, random, cluster, random-count, method, random-compute
    budget: str | None
    seed: int
    overrides: list[str] = field(default_factory=list)
    match_of: str | None = None
    match_by: str = "kept_count"


@dataclass
class CellState:
    cell: TrackCell
    config: ExperimentConfig  # the final config where known; a matched run's unmatched one before
    resolved: bool  # config is final (not matched, or its reference is in the store)
    done: bool  # its results are in the store, current for the eval settings


def slug(text: str) -> str:
    """A label-safe spelling: letters, digits, '.', '_' and '-' ('%' reads 'pct')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text.replace("%", "pct")).strip("-") or "x"


def method_overrides(method: str, params: list[str]) -> list[str]:
    """selection.method and selection.params.<k>=<v> for the `--params k=v` pairs (ConfigError
    for a pair that is not `key=value`)."""
    out = [f"selection.method={method}"]
    for p in params:
        key = p.split("=", 1)[0].strip()
        if "=" not in p or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
            raise ConfigError(f"--params: {p!r}: expected key=value (a parameter of {method!r})")
        parse_override(f"selection.params.{p}")  # a value YAML cannot read fails here
        out.append(f"selection.params.{p}")
    return out


def method_label(method: str, params: list[str]) -> str:
    """The method's part of its runs' labels: its name and its `--params`, label-safe."""
    return slug(method + ("-" + "-".join(params) if params else ""))


def check_method(method: str, params: list[str]) -> None:
    """ConfigError unless `method` is a selector that takes a budget (not one of the track's
    baselines). Any such method gets its random runs at equal compute: their kept count comes
    from the method's measured costs once its run has trained (repro/experiments/compute.py), so
    the method need not declare its own selection cost (`planned_selection_passes`)."""
    from repro.contracts import takes_budget
    from repro.core.registry import SELECTORS

    if method in BASELINE_NAMES:
        raise ConfigError(
            f"--method {method}: {method} is a baseline every track runs; compare another method"
        )
    SELECTORS.get(method)  # an unknown name: "did you mean", the known names
    if not takes_budget(method):
        raise ConfigError(
            f"--method {method}: the selector sets its own kept count (takes_budget = False), so it "
            "cannot run at a track's budgets (kept fractions or counts)"
        )


def cells(
    track: Track,
    method: str | None,
    params: list[str] = (),  # type: ignore[assignment]
    seeds: list[int] | None = None,
    budgets: list[str] | None = None,
) -> list[TrackCell]:
    """Every run the comparison of `method` on `track` needs (None: the baselines alone), in the
    order they run (module docstring). `seeds` and `budgets` restrict it to some of the track's."""
    for s in seeds or []:
        if s not in track.seeds:
            raise ConfigError(f"--seeds: {s} is not a seed of track {track.track} ({track.seeds})")
    chosen: list[Budget] = [track.budget(b) for b in budgets] if budgets else list(track.budgets)
    m_ovr = method_overrides(method, list(params)) if method else []
    m_label = method_label(method, list(params)) if method else ""
    out: list[TrackCell] = []
    for seed in seeds or track.seeds:
        s = f"s{seed}"
        out.append(TrackCell(f"full-{s}", "full", None, seed, ["selection.method=full"]))
        later: list[TrackCell] = []
        for b in chosen:
            bs = slug(b.name)
            cl = f"cluster-{bs}-{s}"
            out.append(
                TrackCell(
                    f"random-{bs}-{s}", "random", b.name, seed, ["selection.method=random", *b.overrides()]
                )
            )
            out.append(TrackCell(cl, "cluster", b.name, seed, cluster_overrides(track, b)))
            out.append(
                TrackCell(
                    f"random-count-of-{cl}", "random-count", b.name, seed, ["selection.method=random"], cl
                )
            )
            later.append(
                TrackCell(
                    f"random-compute-of-{cl}",
                    "random-compute",
                    b.name,
                    seed,
                    ["selection.method=random"],
                    cl,
                    "compute",
                )
            )
            if method:
                ml = f"{m_label}-{bs}-{s}"
                out.append(TrackCell(ml, "method", b.name, seed, [*m_ovr, *b.overrides()]))
                later.append(
                    TrackCell(
                        f"random-compute-of-{ml}",
                        "random-compute",
                        b.name,
                        seed,
                        ["selection.method=random"],
                        ml,
                        "compute",
                    )
                )
        out += later
    return out


# Config keys that do not tell two runs of a store apart for a matched cell: where things are,
# and the count a match gives (the run is found by its match record instead).
_NOT_COMPARED = ("name", "output_dir", "data_dir", "launch", "eval")


def _matched_runs(results: Path, run_name: str) -> dict[tuple[str, str], list[tuple[dict[str, Any], Path]]]:
    """The store's matched runs of one track, by (how matched, the run id matched to): their
    stored config (run.json) and folder. Read without building configs (cheap)."""
    import json

    out: dict[tuple[str, str], list[tuple[dict[str, Any], Path]]] = {}
    for rec_path in sorted((results / run_name).glob("*/run.json")):
        try:
            config = json.loads(rec_path.read_text(encoding="utf-8")).get("config") or {}
        except (OSError, ValueError):
            continue
        m = (config.get("selection") or {}).get("matched")
        if isinstance(m, dict) and m.get("run_id"):
            out.setdefault((str(m.get("by")), str(m["run_id"])), []).append((config, rec_path.parent))
    return out


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    d = {k: v for k, v in config.items() if k not in _NOT_COMPARED}
    d["selection"] = {
        k: v for k, v in (d.get("selection") or {}).items() if k not in ("n", "fraction", "matched")
    }
    return d


def states(track: Track, todo: list[TrackCell], results: Path, extra: list[str] = ()) -> list[CellState]:  # type: ignore[assignment]
    """Each cell's config and whether the store under `results` holds its results (current for
    the eval settings). A matched cell is in the store when a run there was matched the same way
    to its reference's run and is the cell in every other setting; one that is not, whose
    reference is, gets its final config (its count or compute worked out from that run, as the
    runner would); one whose reference is not stays unresolved."""
    from repro.core.config.load import from_dict
    from repro.core.rundir import stage_current
    from repro.experiments.matching import resolve_match

    matched_runs = _matched_runs(results, track.run_name)
    by_label: dict[str, CellState] = {}
    out: list[CellState] = []
    for c in todo:
        cfg = track.config(c.seed, [f"output_dir={results}", *extra, *c.overrides])
        resolved, done = True, False
        if c.match_of is None:
            done = stage_current(cfg, cfg.run_dir(), "results")
        else:
            ref = by_label[c.match_of]
            resolved = ref.done
            if ref.done:
                ref_id = f"{ref.config.name}-{ref.config.hash()}"
                want = _comparable(cfg.to_dict())
                held = [
                    d
                    for conf, d in matched_runs.get((c.match_by, ref_id), [])
                    if _comparable(conf) == want and stage_current(cfg, d, "results")
                ]
                if held:
                    cfg, done = (
                        from_dict(read_json(held[0] / "run.json")["config"], [f"output_dir={results}"]),
                        True,
                    )
                else:
                    where = f"track {track.track}: run {c.label}"
                    matched = resolve_match(
                        cfg, c.match_by, ref.config, ref.config.run_dir(), ref.cell.label, where
                    )
                    resolved = matched is not None
                    cfg = matched if matched is not None else cfg
                    done = resolved and stage_current(cfg, cfg.run_dir(), "results")
        st = CellState(c, cfg, resolved, done)
        by_label[c.label] = st
        out.append(st)
    return out


def run(track: Track, found: list[CellState]) -> list[Path]:
    """Run the cells of `found` that the store lacks, in order, through the experiment layer's
    runner; every config is preflight-checked before any runs. Returns their run folders."""
    from repro.experiments.inline import run_in_order
    from repro.preflight import require_clean
    from repro.problems import report

    missing = [s for s in found if not s.done]
    if not missing:
        return []
    where = {s.cell.label: f"track {track.track}: run {s.cell.label}" for s in missing}
    notes = require_clean([(where[s.cell.label], s.config) for s in missing])
    if any(notes.values()):
        print(report(notes), file=sys.stderr, flush=True)
    items: list[tuple[str, ExperimentConfig, str | None, str]] = [
        # resolved: its final config (a matched one's reference is in the store, never reopened)
        (s.cell.label, s.config, None if s.resolved else s.cell.match_of, s.cell.match_by)
        for s in missing
    ]
    return run_in_order(items, where=lambda label: where[label])


def launch_cells(found: list[CellState]) -> list[TrackCell]:
    """The cells of `found` an experiment file for the launcher holds: those the store lacks,
    and the finished runs that a missing matched cell takes its kept count or compute from (the
    launcher matches a cell to a run of its own experiment, by label, and reads that run's
    folder; it skips the finished run itself). In the order of `found`."""
    missing = {s.cell.label for s in found if not s.done}
    refs = {s.cell.match_of for s in found if not s.done and s.cell.match_of is not None}
    return [s.cell for s in found if s.cell.label in missing or s.cell.label in refs]


def run_list_mapping(
    track: Track,
    todo: list[TrackCell],
    results: str,
    extra: list[str] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """The cells as an experiment file (a run list: base, overrides, runs) that `cluster-repro
    grid` runs here and `cluster-repro launch` runs as jobs (`track run --plan`, and `track run
    --cluster slurm` through the launcher); `extra`: overrides of every run (where things are),
    before each run's own, as `states` applies them."""
    runs = []
    for c in todo:
        entry: dict[str, Any] = {"label": c.label, "overrides": [f"seed={c.seed}", *c.overrides]}
        if c.match_of is not None:
            entry["match_compute_of" if c.match_by == "compute" else "match_kept_count_of"] = c.match_of
        runs.append(entry)
    shared = [o for o in track.overrides_for(track.seeds[0]) if not o.startswith("seed=")]
    return {
        "name": track.run_name,
        "base": str(track.base_path),
        "overrides": [*shared, f"output_dir={results}", *extra],
        "runs": runs,
    }
