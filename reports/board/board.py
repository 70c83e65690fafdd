"""The board: per budget, each method of the track with its quality, its paired differences
against random, its costs, and a rank it shares with every method it is not told apart from.

Per budget, one entry per method (each method given, CluSTER, random at the budget's count) and
full data as the reference line. For each:

- the primary metric (and each secondary one): the mean over seeds with its 95% Student-t
  interval (reports/stats.py `mean_ci`), the metric's value of a run being the mean over the
  metric's benchmarks (fractions in percent, loss as it is);
- its paired differences, per seed, against random at equal count (the random run of the same
  seed with the same kept count: random at the budget, or random matched to this run's kept
  count) and against random at equal compute (matched to this run's selection + training
  cost), with intervals over the seeds (`paired_diff`), signed so that + is better;
- its costs from the rows: selection device-seconds (selection_s x workers: the devices are held
  while it selects; selection_s holds a reused feature pass: reports/load.py) and their
  share of training's, the total (selection + training, device-s:
  what compute matching equalizes), end-to-end seconds and the predicted straggler idle;
- its rank: 1 + the number of methods significantly better than it. Every pair of methods of a
  budget is compared on the seeds they share (the paired difference's t-test, p against 0) and
  the p-values of the budget are Holm-adjusted together (`holm`): a method shares its rank with
  every method no adjusted test tells apart from it, so noise never crowns one. With fewer than
  two shared seeds a pair has no test and ties.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from reports.board.sources import Placed, Sources
from reports.runs import RAW_METRICS, Run
from reports.stats import Estimate, holm, mean_ci, paired_diff
from repro.core.tracks import CLUSTER, FULL, METHOD, RANDOM, RANDOM_COMPUTE, RANDOM_COUNT, MetricSpec, Track

ALPHA = 0.05


def run_value(r: Run, m: MetricSpec) -> float | None:
    """The run's value of metric `m`: the mean over its benchmarks (fractions x 100); None when
    a benchmark is missing or the run diverged."""
    if r.status == "diverged":
        return None
    vals = []
    for b in m.benchmarks:
        v = r.scores.get((b, m.metric))
        if v is None or b in r.missing:
            return None
        vals.append(v if m.metric in RAW_METRICS else 100.0 * v)
    return float(np.mean(vals))


@dataclass
class Entry:
    """One line of the board: a method at a budget (or full data, the reference)."""

    budget: str
    label: str
    role: str
    runs: dict[int, Run]  # seed -> run
    quality: Estimate | None = None
    secondary: list[Estimate | None] = field(default_factory=list)
    vs_count: Estimate | None = None
    vs_compute: Estimate | None = None
    kept: Estimate | None = None
    selection_device_s: Estimate | None = None
    selection_share: Estimate | None = None  # percent of training's device-seconds
    total_device_s: Estimate | None = None
    end_to_end_s: Estimate | None = None
    idle: Estimate | None = None  # percent
    rank: int | None = None
    ties: list[str] = field(default_factory=list)  # methods it is not told apart from
    diverged: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return sorted(self.runs)

    @property
    def ranked(self) -> bool:
        return self.role != FULL


@dataclass
class Board:
    track: Track
    entries: list[Entry]
    notes: list[str]
    sources: list[str]

    def budget_entries(self, budget: str) -> list[Entry]:
        return [e for e in self.entries if e.budget == budget]


def _cost(runs: list[Run], f: Callable[[Run], float | None]) -> Estimate | None:
    return mean_ci([f(r) for r in runs])


def _col(r: Run, name: str) -> float | None:
    v = r.costs.get(name)
    return None if v is None else float(v)


def _selection_dev(r: Run) -> float | None:
    """Selection device-seconds: selection_s x workers. A feature pass the run reused from a
    shared features job is in its selection_s already (reports/load.py count_reused_features),
    as compute matching counts it."""
    s = _col(r, "selection_s")
    return None if s is None else s * (r.world_size or 1)


def _total_dev(r: Run) -> float | None:
    s, t = _selection_dev(r), _col(r, "train_s")
    return None if s is None or t is None or r.status == "diverged" else s + t * (r.world_size or 1)


def _share(r: Run) -> float | None:
    s, t = _selection_dev(r), _col(r, "train_s")
    return None if s is None or not t or r.status == "diverged" else 100.0 * s / (t * (r.world_size or 1))


def _idle(r: Run) -> float | None:
    v = _col(r, "predicted_idle_share")
    return None if v is None else 100.0 * v


def _paired(
    runs: dict[int, Run], refs: dict[int, Run | None], m: MetricSpec
) -> tuple[Estimate | None, list[int]]:
    """The mean over seeds of (run - its reference), + better; and the seeds without a pair."""
    sign = 1.0 if m.higher_is_better else -1.0
    diffs, lacking = [], []
    for seed, r in sorted(runs.items()):
        ref = refs.get(seed)
        a = run_value(r, m)
        b = None if ref is None else run_value(ref, m)
        if a is None or b is None:
            lacking.append(seed)
            continue
        diffs.append(sign * (a - b))
    return (paired_diff(diffs) if diffs else None), lacking


def _references(entry: Entry, placed: list[Placed]) -> tuple[dict[int, Run | None], dict[int, Run | None]]:
    """Per seed, the run's random reference at equal count and at equal compute."""
    count: dict[int, Run | None] = {}
    compute: dict[int, Run | None] = {}
    for seed, r in entry.runs.items():
        by_count = [
            p.run
            for p in placed
            if p.place.role == RANDOM_COUNT and p.place.of_run == r.run_id and p.run.seed == seed
        ]
        if not by_count:  # random at the budget, when it kept as many
            by_count = [
                p.run
                for p in placed
                if p.place.role == RANDOM
                and p.budget == entry.budget
                and p.run.seed == seed
                and p.run.n_selected == r.n_selected
            ]
        count[seed] = by_count[0] if by_count else None
        by_compute = [p.run for p in placed if p.place.role == RANDOM_COMPUTE and p.place.of_run == r.run_id]
        compute[seed] = by_compute[0] if by_compute else None
    return count, compute


def _fill(entry: Entry, track: Track, placed: list[Placed]) -> None:
    runs = [entry.runs[s] for s in entry.seeds]
    m = track.metrics.primary
    entry.diverged = any(r.status == "diverged" for r in runs)
    entry.quality = mean_ci([run_value(r, m) for r in runs])
    entry.secondary = [mean_ci([run_value(r, s) for r in runs]) for s in track.metrics.secondary]
    entry.kept = mean_ci([None if r.n_selected is None else float(r.n_selected) for r in runs])
    entry.selection_device_s = _cost(runs, _selection_dev)
    entry.selection_share = _cost(runs, _share)
    entry.total_device_s = _cost(runs, _total_dev)
    entry.end_to_end_s = _cost(runs, lambda r: _col(r, "end_to_end_s"))
    entry.idle = _cost(runs, _idle)
    if entry.role in (METHOD, CLUSTER):
        count, compute = _references(entry, placed)
        entry.vs_count, lack_n = _paired(entry.runs, count, m)
        entry.vs_compute, lack_c = _paired(entry.runs, compute, m)
        if lack_n:
            entry.notes.append(f"no random run at equal count for seed(s) {', '.join(map(str, lack_n))}")
        if lack_c:
            entry.notes.append(f"no random run at equal compute for seed(s) {', '.join(map(str, lack_c))}")


def _rank(entries: list[Entry], m: MetricSpec) -> None:
    """Shared ranks within one budget (module docstring)."""
    ranked = [e for e in entries if e.ranked and e.quality is not None]
    sign = 1.0 if m.higher_is_better else -1.0
    pairs, ps, ests = [], [], []
    for a, b in combinations(ranked, 2):
        shared = sorted(set(a.runs) & set(b.runs))
        diffs = []
        for s in shared:
            x, y = run_value(a.runs[s], m), run_value(b.runs[s], m)
            if x is not None and y is not None:
                diffs.append(sign * (x - y))
        est = paired_diff(diffs) if len(diffs) >= 2 else None
        p = None if est is None else est.p_value(0.0)
        pairs.append((a, b))
        ps.append(p)
        ests.append(est)
    adjusted = holm(ps)
    better: dict[int, int] = {id(e): 0 for e in ranked}
    apart: set[tuple[int, int]] = set()
    for (a, b), q, est in zip(pairs, adjusted, ests):
        if q is None or est is None or q >= ALPHA or est.value == 0:
            continue
        winner = a if est.value > 0 else b
        loser = b if winner is a else a
        better[id(loser)] += 1
        apart |= {(id(a), id(b)), (id(b), id(a))}
    for e in ranked:
        e.rank = 1 + better[id(e)]
        e.ties = [o.label for o in ranked if o is not e and (id(e), id(o)) not in apart]


def _key(e: Entry, m: MetricSpec) -> tuple:
    q = e.quality.value if e.quality is not None else math.nan
    better = -q if m.higher_is_better else q
    return (e.rank if e.rank is not None else 10**6, better if not math.isnan(better) else math.inf, e.label)


def build_board(src: Sources) -> Board:
    """The board of the runs placed in `src.track` (reports/board/sources.py)."""
    track = src.track
    entries: list[Entry] = []
    full = {p.run.seed: p.run for p in src.placed if p.place.role == FULL}
    for b in track.budgets:
        groups: dict[tuple[str, str], dict[int, Run]] = {}
        for p in src.placed:
            if p.budget == b.name and p.place.role in (METHOD, CLUSTER, RANDOM):
                groups.setdefault((p.place.role, p.place.label), {})[p.run.seed] = p.run
        block = [Entry(b.name, label, role, runs) for (role, label), runs in groups.items()]
        if full:
            block.append(Entry(b.name, "full data", FULL, dict(full)))
        for e in block:
            _fill(e, track, src.placed)
        _rank(block, track.metrics.primary)
        block.sort(key=lambda e: (e.role == FULL, *_key(e, track.metrics.primary)))
        entries += block
    seeds = sorted({s for e in entries for s in e.seeds})
    notes = list(src.notes)
    lacking = [s for s in track.seeds if s not in seeds]
    if lacking:
        notes.append(f"seeds of the track with no run here: {', '.join(map(str, lacking))}")
    return Board(track, entries, notes, src.files)
