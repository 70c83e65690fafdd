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
`mean_ci`): how much the small setting's decisions move with the seed. Every pair the two stores
order differently is listed, with both differences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

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
                label, names, pairs, agree, agree / pairs if pairs else None, mean_ci(per_seed), flips, left
            )
        )
    return out


def agreement_text(rows: list[BudgetAgreement], small: str, large: str) -> str:
    """The result as Markdown: a table per budget, then the flipped pairs."""
    lines = [
        f"# Decision accuracy: {small} against {large}",
        "",
        f"The share of method pairs both stores order the same way ({CITATION}); per seed: the "
        "same share from each seed of the small store, mean and 95% Student-t interval over seeds.",
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
