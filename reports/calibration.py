"""How often the claims' verdicts are wrong: stores simulated with a known effect, read through the
code the claims command uses (reports/stats.py `paired_diff` and `item_diff`, reports/claims/verdicts.py
`_decide`), against the rule they replaced (a 95% percentile bootstrap over seeds, items of all
seeds pooled per benchmark, one seed's items enough for a firm verdict).

Two scenarios, at noise levels of the suite's own runs (docs/claims.md says where each is from):

- `held-out loss`: one difference per seed, no items (the CPU-scale checks). Seed-to-seed sd of
  the difference 0.0066 nats: the cut-down medical pool's CluSTER r = 0.5 vs full data over
  seeds 42, 0, 1 (-0.190, -0.191, -0.202; docs/measurements.md); threshold -0.0765 nats (any
  threshold gives the same rates: they depend on the true effect's distance from it).
- `code average`: HumanEval and HumanEval+ scored 0/1 per problem (164 problems, the same in
  both), the domain average of the two. Per problem the two runs disagree with probability 0.2
  (a difference of +-100 points, else 0); HumanEval+ repeats the base difference of a problem
  with probability 0.8, else draws its own; each seed's true difference moves by a seed effect
  of sd 1.5 points. Threshold -1.7 points (C1's).

At the threshold, each firm verdict should come out at most 2.5% of the time (two-sided 95%);
away from it (by 3 per-seed sds of the difference), the right one should come out often with 5
seeds. `cluster-repro bench calibration` prints the table; tests/test_calibration.py holds the
new rule to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from reports.claims.verdicts import _decide
from reports.stats import Estimate, SeedDiff, item_diff, paired_diff

NOMINAL = 0.025  # each firm verdict's rate at the threshold under a two-sided 95% interval


@dataclass(frozen=True)
class Scenario:
    name: str
    threshold: float
    seed_sd: float  # sd of each seed's true difference around the effect
    problems: int = 0  # 0: no items (one number per seed)
    disagree: float = 0.2  # P(the two runs differ on a problem)
    plus_same: float = 0.8  # P(the plus variant repeats the base difference of a problem)

    def per_seed_sd(self) -> float:
        """sd of one seed's measured difference: seed effect and item noise together."""
        if not self.problems:
            return self.seed_sd
        v_item = 1e4 * self.disagree * (1 + self.plus_same) / 2 / self.problems
        return math.sqrt(self.seed_sd**2 + v_item)


LOSS = Scenario("held-out loss (nats)", threshold=-0.0765, seed_sd=0.0066)
CODE = Scenario("code average, HumanEval + HumanEval+ (points)", threshold=-1.7, seed_sd=1.5, problems=164)
SCENARIOS = (LOSS, CODE)
# One seed's item interval taken as firm, where seeds vary as much as one seed's item noise:
# what a one-seed verdict would risk when the seed noise it cannot see is larger.
CODE_SEEDY = replace(CODE, name="code average, seed sd 3.3 points (= item noise)", seed_sd=3.3)


def _items(sc: Scenario, m: float, rng: np.random.Generator) -> dict[str, dict[str, float]]:
    """One seed's per-item differences (points) of both benchmarks with true mean m."""
    q = sc.disagree
    p_up = min(max((q + m / 100) / 2, 0.0), q)

    def draw(n: int) -> np.ndarray:
        u = rng.random(n)
        return np.where(u < p_up, 100.0, np.where(u < q, -100.0, 0.0))

    base = draw(sc.problems)
    plus = np.where(rng.random(sc.problems) < sc.plus_same, base, draw(sc.problems))
    ids = _ids(sc.problems)
    return {
        "humaneval@evalplus": dict(zip(ids, base.tolist())),
        "humaneval_plus@evalplus": dict(zip(ids, plus.tolist())),
    }


@lru_cache(maxsize=8)
def _ids(n: int) -> tuple[str, ...]:
    return tuple(f"HumanEval/{i}" for i in range(n))


def simulate(sc: Scenario, seeds: int, effect: float, rng: np.random.Generator) -> list:
    """One simulated store's per-seed inputs: plain differences, or per-item differences."""
    true = effect + rng.normal(0.0, sc.seed_sd, seeds)
    if not sc.problems:
        return true.tolist()
    return [_items(sc, m, rng) for m in true]


def new_estimate(data: list) -> Estimate | None:
    """What the claims command computes (reports/claims/verdicts.py `_paired_quality`)."""
    if data and isinstance(data[0], dict):
        seeds = [item_diff(d) for d in data]
        return paired_diff([s for s in seeds if isinstance(s, SeedDiff)])
    return paired_diff(data)


def old_estimate(data: list, rng: np.random.Generator, n_boot: int = 2000) -> tuple[float, float] | None:
    """The replaced rule: a 95% percentile bootstrap of the mean, over seeds, or over the items of
    all seeds pooled, each benchmark resampled on its own and the means averaged."""
    if data and isinstance(data[0], dict):
        groups = [np.concatenate([np.fromiter(d[b].values(), float) for d in data]) for b in data[0]]
    else:
        groups = [np.asarray(data, dtype=float)]
    if min(g.size for g in groups) < 2:
        return None
    boot = np.zeros(n_boot)
    for g in groups:
        boot += g[rng.integers(0, g.size, size=(n_boot, g.size))].mean(axis=1)
    lo, hi = np.quantile(boot / len(groups), [0.025, 0.975])
    return float(lo), float(hi)


def _verdict(lo: float | None, hi: float | None, thr: float) -> str:
    if lo is None or hi is None:
        return "inconclusive"
    return "consistent" if lo > thr else "not reproduced" if hi < thr else "inconclusive"


@dataclass
class Rates:
    reps: int
    consistent: float
    not_reproduced: float
    covered: float  # the interval held the true effect (where there was one)

    def bound(self) -> float:
        """The nominal rate plus 3 binomial standard errors at that rate (Monte Carlo error)."""
        return NOMINAL + 3 * math.sqrt(NOMINAL * (1 - NOMINAL) / self.reps)


def rates(sc: Scenario, seeds: int, effect: float, reps: int, seed: int = 0, method: str = "new") -> Rates:
    """Verdict rates over `reps` simulated stores. method: new (`_decide` on `paired_diff`), old
    (the replaced bootstrap, one seed's items firm), items-firm (the new interval, but one seed's
    items allowed a firm verdict: what the one-seed rule declines)."""
    rng = np.random.default_rng([seed, seeds, int(effect * 1e6) & 0xFFFFFFFF, len(sc.name)])
    boot_rng = np.random.default_rng([seed, 1, seeds])
    n = {"consistent": 0, "not reproduced": 0}
    covered = with_interval = 0
    for _ in range(reps):
        data = simulate(sc, seeds, effect, rng)
        if method == "old":
            ci = old_estimate(data, boot_rng)
            lo, hi = ci if ci else (None, None)
            verdict = _verdict(lo, hi, sc.threshold)
        else:
            est = new_estimate(data)
            lo, hi = (est.lo, est.hi) if est else (None, None)
            if method == "items-firm":
                verdict = _verdict(lo, hi, sc.threshold)
            else:
                verdict = _decide(est, sc.threshold, True)[0]
        if verdict in n:
            n[verdict] += 1
        if lo is not None and hi is not None:
            with_interval += 1
            covered += lo <= effect <= hi
    return Rates(reps, n["consistent"] / reps, n["not reproduced"] / reps, covered / max(with_interval, 1))


def away(sc: Scenario) -> float:
    """How far 'well away from the threshold' is: 3 per-seed sds of the difference."""
    return 3 * sc.per_seed_sd()


def table(
    reps: int = 2000, old_reps: int = 2000, old_item_reps: int = 500, seeds: tuple[int, ...] = (1, 2, 3, 5)
) -> str:
    """The calibration table (Markdown): per scenario, seeds and rule, the coverage of the true
    effect, each firm verdict's rate with the effect at the threshold, and the right verdict's
    rate with it 3 per-seed sds above / below."""
    lines = [
        "| scenario | seeds | rule | coverage | at threshold: consistent | at threshold: not reproduced "
        "| 3 sd above: consistent | 3 sd below: not reproduced |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sc in SCENARIOS:
        d = away(sc)
        for s in seeds:
            rules = [("old", old_item_reps if sc.problems else old_reps), ("new", reps)]
            if s == 1 and sc.problems:
                rules.insert(1, ("items-firm", reps))
            for method, n in rules:
                at = rates(sc, s, sc.threshold, n, method=method)
                up = rates(sc, s, sc.threshold + d, n, method=method)
                down = rates(sc, s, sc.threshold - d, n, method=method)
                label = {
                    "old": "old: percentile bootstrap",
                    "new": "new: t over seeds" + (", one seed not firm" if s == 1 else ""),
                    "items-firm": "one seed's item interval taken as firm",
                }[method]
                cov = "—" if s == 1 and not sc.problems else f"{at.covered:.1%}"
                lines.append(
                    f"| {sc.name} | {s} | {label} | {cov} | {at.consistent:.1%} | {at.not_reproduced:.1%} "
                    f"| {up.consistent:.1%} | {down.not_reproduced:.1%} |"
                )
                if method == "items-firm":
                    at = rates(CODE_SEEDY, 1, CODE_SEEDY.threshold, n, method=method)
                    lines.append(
                        f"| {CODE_SEEDY.name} | 1 | {label} | {at.covered:.1%} | {at.consistent:.1%} | "
                        f"{at.not_reproduced:.1%} | | |"
                    )
    bound = Rates(reps, 0, 0, 0).bound()
    lines += [
        "",
        f"{reps:,} simulated stores a row (the old rule: {old_reps:,}, with items {old_item_reps:,}: its "
        f"bootstrap of pooled items is slow); nominal 2.5% for each firm "
        f"verdict at the threshold, {bound:.2%} with 3 Monte Carlo standard errors. 3 sd: "
        + "; ".join(f"{sc.name} {away(sc):.4g}" for sc in SCENARIOS)
        + ".",
    ]
    return "\n".join(lines)
