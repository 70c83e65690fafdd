"""Decision accuracy: how often a small experiment orders two methods as a large one does.

DataDecide (Magnusson et al. 2025, "DataDecide: How to Predict Best Pretraining Data with Small
Experiments") measures a small setting by its *decision accuracy*: over every pair of methods,
the share that the small setting orders the same way as the large one. Here, per budget of the
tracks (paired by name, else by position: `budget_pairs`), the methods are the board's (each
method, CluSTER, random at the budget), a method's value its track's primary metric's mean over
seeds (each store on its own track's metric, signed so that higher is better), and a pair counts
where the large store orders it (a tie there is no decision to predict, and is left out); a tie in
the small store does not order the pair, so it counts as a miss.

The interval: the same share taken from each seed of the small store alone (that seed's values
against the large store's means), a 95% Student-t interval over those seeds (reports/stats.py
`mean_ci`), widened by half a pair's share on each side and kept within [0, 1] (`seed_interval`):
how much the small setting's decisions move with the seed. A share moves in steps of one pair, so
three seeds often land on the same few values and the t interval alone is too narrow: in
simulation (`simulated_coverage`, docs/compare.md) it covered the expected per-seed share 71-96% of
the time at a nominal 95%, the widened one 95-98%. Every pair the two stores order differently is
listed, with both differences.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np

from reports.board.board import Board, Entry, run_value
from reports.stats import Estimate, mean_ci
from repro.core.tracks import FULL, MetricSpec

CITATION = 'Magnusson et al. 2025, "DataDecide: How to Predict Best Pretraining Data with Small Experiments"'


@dataclass
class Flip:
    a: str
    b: str
    small: float  # a - b in the small store, + when a is better
    large: float


@dataclass
class BudgetAgreement:
    budget: str
    methods: list[str]
    pairs: int  # pairs the large store orders
    agree: int
    accuracy: float | None
    per_seed: Estimate | None
    flips: list[Flip] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # methods in one store only


def _goodness(entries: list[Entry], m: MetricSpec) -> dict[str, float]:
    """Each method's mean on its board's primary metric, signed so that higher is better."""
    sign = 1.0 if m.higher_is_better else -1.0
    return {e.label: sign * e.quality.value for e in entries if e.role != FULL and e.quality is not None}


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _share(small: dict[str, float], large: dict[str, float], names: list[str]) -> tuple[int, int, list[Flip]]:
    agree = pairs = 0
    flips = []
    for a, b in combinations(names, 2):
        d_large = large[a] - large[b]
        if d_large == 0:
            continue
        pairs += 1
        d_small = small[a] - small[b]
        if _sign(d_small) == _sign(d_large):
            agree += 1
        else:
            flips.append(Flip(a, b, d_small, d_large))
    return agree, pairs, flips


def seed_interval(per_seed: list[float], pairs: int) -> Estimate | None:
    """The seeds' shares: their mean with a 95% Student-t interval, widened by half a pair's share
    (0.5 / pairs) on each side and kept within [0, 1]. Without the widening, three seeds whose
    shares differ by a pair or two give an interval narrower than a share's own step, which
    misses the expected share far more often than 5% (`simulated_coverage`)."""
    est = mean_ci(per_seed)
    if est is None or est.lo is None or est.hi is None or not pairs:
        return est
    half = 0.5 / pairs
    return replace(est, lo=max(0.0, est.lo - half), hi=min(1.0, est.hi + half))


def simulated_coverage(
    seed_sd: float, methods: int = 9, seeds: int = 3, worlds: int = 400, draws: int = 300, seed: int = 0
) -> tuple[float, float]:
    """How often the per-seed interval holds the expected per-seed share, by simulation:
    (plain Student-t, `seed_interval`'s widened one). Each of `worlds` draws the methods' true
    values at the small scale (sd 1), the large store's means (those plus sd 0.7: the scales order
    some pairs differently), then `seeds` small seeds (true values plus `seed_sd`); the target
    is the mean share over `draws` further seeds."""
    rng = np.random.default_rng(seed)
    i, j = np.array(list(combinations(range(methods), 2))).T

    def shares(values: np.ndarray, large: np.ndarray) -> np.ndarray:  # (n, methods) -> (n,)
        d_large = np.sign(large[i] - large[j])
        return (np.sign(values[:, i] - values[:, j]) == d_large).mean(axis=1)

    plain = widened = 0
    for _ in range(worlds):
        true = rng.normal(0, 1, methods)
        large = true + rng.normal(0, 0.7, methods)
        target = shares(true + rng.normal(0, seed_sd, (draws, methods)), large).mean()
        x = shares(true + rng.normal(0, seed_sd, (seeds, methods)), large).tolist()
        t, w = mean_ci(x), seed_interval(x, len(i))
        plain += t.lo <= target <= t.hi
        widened += w.lo <= target <= w.hi
    return float(plain / worlds), float(widened / worlds)


def budget_pairs(small: Board, large: Board) -> list[tuple[str, str]]:
    """The budgets compared: those both tracks name alike; when they share no name and have as
    many budgets, the i-th of one with the i-th of the other (tracks of other scales keep their
    own budget names: `mini-code`'s 50% beside `paper-code`'s 79%, both CluSTER's r = 1.0)."""
    a, b = small.track.names(), large.track.names()
    shared = [(x, x) for x in a if x in b]
    if not shared and len(a) == len(b):
        return list(zip(a, b))
    return shared


def decision_accuracy(small: Board, large: Board) -> list[BudgetAgreement]:
    """Per budget pair (`budget_pairs`), the decision accuracy of `small` against `large`, each
    store read on its own track's primary metric (signed so that higher is better)."""
    ms, ml = small.track.metrics.primary, large.track.metrics.primary
    sign = 1.0 if ms.higher_is_better else -1.0
    out = []
    for b_small, b_large in budget_pairs(small, large):
        s_entries = small.budget_entries(b_small)
        s_good, l_good = _goodness(s_entries, ms), _goodness(large.budget_entries(b_large), ml)
        names = sorted(set(s_good) & set(l_good))
        left = sorted(set(s_good) ^ set(l_good))
        agree, pairs, flips = _share(s_good, l_good, names)
        per_seed = []
        seeds = sorted({s for e in s_entries if e.label in names for s in e.runs})
        for seed in seeds:
            vals = {}
            for e in s_entries:
                if e.label in names and seed in e.runs:
                    v = run_value(e.runs[seed], ms)
                    if v is not None:
                        vals[e.label] = sign * v
            if set(vals) == set(names):
                a, p, _ = _share(vals, l_good, names)
                if p:
                    per_seed.append(a / p)
        label = b_small if b_small == b_large else f"{b_small} / {b_large}"
        out.append(
            BudgetAgreement(
                label,
                names,
                pairs,
                agree,
                agree / pairs if pairs else None,
                seed_interval(per_seed, pairs),
                flips,
                left,
            )
        )
    return out


def agreement_text(rows: list[BudgetAgreement], small: str, large: str) -> str:
    """The result as Markdown: a table per budget, then the flipped pairs."""
    lines = [
        f"# Decision accuracy: {small} against {large}",
        "",
        f"The share of method pairs both stores order the same way ({CITATION}); per seed: the "
        "same share from each seed of the small store, mean and 95% Student-t interval over seeds "
        "(widened by half a pair each side, within [0, 1]).",
        "",
        "| budget | methods | pairs | agree | decision accuracy | per seed [95% CI] |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        acc = "—" if r.accuracy is None else f"{r.accuracy:.3f}"
        ps = r.per_seed
        if ps is None:
            seed = "—"
        elif ps.lo is None or ps.hi is None:
            seed = f"{ps.value:.3f}†"
        else:
            seed = f"{ps.value:.3f} [{ps.lo:.3f}, {ps.hi:.3f}]"
        lines.append(f"| {r.budget} | {len(r.methods)} | {r.pairs} | {r.agree} | {acc} | {seed} |")
    lines.append("")
    for r in rows:
        if r.flips:
            lines.append(f"Flipped at {r.budget}:")
            lines += [
                f"- {f.a} vs {f.b}: small {f.small:+.4g}, large {f.large:+.4g} (+: the first is better)"
                for f in r.flips
            ]
        if r.left_out:
            lines.append(f"At {r.budget}, in one store only (not compared): {', '.join(r.left_out)}")
    if not any(r.flips for r in rows):
        lines.append("No pair flips.")
    return "\n".join(lines) + "\n"
