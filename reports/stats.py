"""Means and paired differences over training runs with Student-t intervals that hold their level
for few seeds, and the statistics of the analyses.

The unit of replication is the training run (its seed). Every interval is a 95% Student-t
interval over the runs, never a percentile bootstrap of two or three values (whose "95%" interval
is the range [min, max]: with three seeds its true coverage is about 75%). docs/claims.md says
why, with the calibration that checks it (`reports/calibration.py`).

- `mean_ci(values)`: the mean over seeds, mean ± t(0.975, S-1) x sd / sqrt(S). One value: no
  interval (the table marks the cell single-seed).
- `item_diff(benchmarks)`: one seed's paired difference from per-item differences of one or more
  benchmarks (the mean over benchmarks of each one's mean item difference, as a domain average is
  formed), with its variance over problems. Benchmarks that pose the same problems (HumanEval and
  HumanEval+, MBPP and MBPP+: `problem_of`) are one unit per problem, never independent.
- `paired_diff(seeds)`: the mean of per-seed paired differences (plain numbers, or `item_diff`'s).
  Two seeds or more: the t-interval over the seeds' differences (each carries its item noise, so
  their spread holds both). One seed with per-item scores: a t-interval over problems, which
  covers item noise only (`Estimate.items_only`: no firm verdict rests on it, docs/claims.md).
- `Estimate.p_value(threshold)`: the two-sided p of "the mean equals the threshold" from the same
  t distribution as the interval (p < 0.05 exactly when the interval excludes the threshold);
  `holm` adjusts a family of them.
- `jaccard`, `spearman` (ties as scipy's average ranks), `pooled_variance` and `variance_split`
  (a metric's spread over selection seeds vs training seeds): the analyses' statistics.

Deterministic: nothing is drawn at random (the `key` arguments, kept for callers, name what an
interval describes).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import stats as _st

LEVEL = 0.95
ITEMS_ONLY = "one seed: the interval covers item noise only; it cannot show seed-to-seed variation"


@dataclass(frozen=True)
class Estimate:
    """A mean (or mean difference) with its interval; lo/hi are None without one.

    n: seeds, or the problems of one seed's items when unit is "items" (then the interval covers
    item noise only). se and df: the standard error and Student-t degrees of freedom the interval
    is built on (None without one). items: problems per seed where per-item scores were paired."""

    value: float
    lo: float | None = None
    hi: float | None = None
    n: int = 1  # seeds, or problems (unit "items")
    unit: str = "seeds"
    se: float | None = None
    df: float | None = None
    items: int = 0

    @property
    def single(self) -> bool:
        return self.n < 2

    @property
    def items_only(self) -> bool:
        """One seed's item-level interval: item noise only, no seed-to-seed variation."""
        return self.unit == "items" and self.lo is not None

    def p_value(self, threshold: float) -> float | None:
        """Two-sided p of "the true mean equals threshold", from the interval's t distribution;
        None without an interval."""
        if self.se is None or self.df is None:
            return None
        gap = abs(self.value - threshold)
        if self.se == 0:
            return 1.0 if gap == 0 else 0.0
        return float(2 * _st.t.sf(gap / self.se, self.df))


@lru_cache(maxsize=4096)
def t_quantile(df: float) -> float:
    """The two-sided LEVEL quantile of Student's t with df degrees of freedom."""
    return float(_st.t.ppf((1 + LEVEL) / 2, df))


def _t_estimate(value: float, se: float, df: float, n: int, unit: str, items: int = 0) -> Estimate:
    h = t_quantile(df) * se
    return Estimate(value, value - h, value + h, n=n, unit=unit, se=se, df=df, items=items)


def mean_ci(values: Sequence[float | None], key: str = "") -> Estimate | None:
    """Mean of the seeds' values with its Student-t interval; None when there are no values.
    `key` names what it describes (kept for callers; nothing is drawn)."""
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return None
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, n=1)
    se = float(x.std(ddof=1)) / math.sqrt(x.size)
    return _t_estimate(mean, se, x.size - 1, int(x.size), "seeds")


# ----------------------------------------------------------------------------- paired differences

_NAME_PREFIX = re.compile(r"^[A-Za-z_]+/")


def problem_of(benchmark: str, item_id: str) -> tuple[str, str]:
    """The problem an item poses: (benchmark family, problem id). A benchmark and its plus variant
    (humaneval and humaneval_plus, mbpp and mbpp_plus, under one protocol) are one family; the id
    drops a leading name ('HumanEval/0' -> '0', 'Mbpp/11' -> '11', so lm-eval's MBPP id 11 meets
    MBPP+'s Mbpp/11)."""
    return _family(benchmark), _problem_id(str(item_id))


@lru_cache(maxsize=1024)
def _family(benchmark: str) -> str:
    name, _, proto = benchmark.partition("@")
    fam = re.sub(r"[^a-z0-9/]", "", name.lower())
    if fam.endswith("plus"):
        fam = fam[: -len("plus")]
    return f"{fam}@{proto}"


@lru_cache(maxsize=1 << 16)
def _problem_id(item_id: str) -> str:
    return _NAME_PREFIX.sub("", item_id)


@dataclass(frozen=True)
class SeedDiff:
    """One seed's paired difference and its sampling variance over problems (items)."""

    value: float
    var: float
    problems: int


def item_diff(benchmarks: dict[str, dict[str, float]]) -> SeedDiff | None:
    """One seed's difference from per-item differences {benchmark: {item id: cell - reference}}:
    the mean over benchmarks of each one's mean item difference (as a domain average is formed),
    and its variance with a problem as the unit. A problem's items in benchmarks of one family
    (`problem_of`) move together: its contribution to the average, c_u = sum over its items of
    diff / (B x n_b), is one unit, and the variance of the sum over U units is
    U / (U - 1) x sum (c_u - mean c)^2 (what a bootstrap over problems estimates). None when a
    benchmark has no items."""
    if not benchmarks or any(not d for d in benchmarks.values()):
        return None
    units: dict[tuple[str, str], float] = {}
    nb = len(benchmarks)
    for b, d in benchmarks.items():
        w = 1.0 / (nb * len(d))
        fam = _family(b)
        for iid, x in d.items():
            u = (fam, _problem_id(str(iid)))
            units[u] = units.get(u, 0.0) + w * float(x)
    c = np.fromiter(units.values(), dtype=np.float64, count=len(units))
    u = c.size
    var = float(u / (u - 1) * ((c - c.mean()) ** 2).sum()) if u > 1 else float("nan")
    return SeedDiff(float(c.sum()), var, u)


def paired_diff(seeds: Sequence[float | SeedDiff], key: str = "", unit: str = "") -> Estimate | None:
    """The mean of per-seed paired differences (cell minus reference), with its interval.

    seeds: one difference per seed, a number or an `item_diff`. Two or more seeds: the Student-t
    interval over the seeds' differences (df = seeds - 1). One seed with per-item differences:
    the t-interval over its problems (unit "items": item noise only). One plain number: no
    interval. None without seeds. `key` and `unit` are kept for callers (nothing is drawn; the
    unit follows from what is given)."""
    if not seeds:
        return None
    vals = [s.value if isinstance(s, SeedDiff) else float(s) for s in seeds]
    probs = [s.problems for s in seeds if isinstance(s, SeedDiff)]
    items = min(probs) if probs else 0
    if len(vals) >= 2:
        x = np.asarray(vals, dtype=np.float64)
        se = float(x.std(ddof=1)) / math.sqrt(x.size)
        return _t_estimate(float(x.mean()), se, x.size - 1, x.size, "seeds", items)
    s = seeds[0]
    if isinstance(s, SeedDiff) and s.problems >= 2:
        return _t_estimate(s.value, math.sqrt(s.var), s.problems - 1, s.problems, "items", items)
    return Estimate(vals[0], n=1, unit="seeds", items=items)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values of a family (None entries are not in it): the i-th
    smallest of m becomes max over j <= i of min(1, (m - j + 1) p_(j)). Rejecting where the
    adjusted p < 1 - LEVEL holds the family-wise error rate at 1 - LEVEL."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])  # type: ignore[arg-type,return-value]
    m = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    run = 0.0
    for j, i in enumerate(idx):
        run = max(run, min(1.0, (m - j) * float(pvalues[i])))  # type: ignore[arg-type]
        out[i] = run
    return out


# ----------------------------------------------------------------------------- analyses


def jaccard(a: set[Any] | list[Any], b: set[Any] | list[Any]) -> float:
    """|A ∩ B| / |A ∪ B| of two kept sets (duplicates count once); two empty sets: 1."""
    a, b = set(a), set(b)
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span (scipy's rankdata 'average')."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(len(x), dtype=np.float64)
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float] | np.ndarray, y: list[float] | np.ndarray) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks (so ties are handled as scipy's
    spearmanr does). None with fewer than two pairs or when either side is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"spearman: {x.shape} vs {y.shape} values, expected pairs")
    if len(x) < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    return None if den == 0 else float((rx * ry).sum() / den)


def pooled_variance(groups: list[list[float]]) -> tuple[float | None, int]:
    """The pooled within-group variance Σ_g Σ_i (x_gi - mean_g)² / Σ_g (n_g - 1) over the groups
    of two or more values, and its degrees of freedom; (None, 0) without such a group."""
    ss, df = 0.0, 0
    for g in groups:
        if len(g) < 2:
            continue
        a = np.asarray(g, dtype=np.float64)
        ss += float(((a - a.mean()) ** 2).sum())
        df += len(a) - 1
    return (ss / df if df else None), df


def variance_split(values: dict[tuple[int, int], float]) -> dict[str, Any]:
    """Split a metric's spread over {(selection_seed, training_seed): value} of runs that differ
    in nothing else. selection: the pooled variance across selection seeds within each training
    seed (runs that differ only in selection_seed); training: the pooled variance across training
    seeds within each selection seed. Each with its degrees of freedom; share_selection:
    selection / (selection + training) when both are known."""
    by_t: dict[int, list[float]] = {}
    by_s: dict[int, list[float]] = {}
    for (s, t), v in sorted(values.items()):
        by_t.setdefault(t, []).append(v)
        by_s.setdefault(s, []).append(v)
    v_sel, df_sel = pooled_variance(list(by_t.values()))
    v_train, df_train = pooled_variance(list(by_s.values()))
    both = v_sel is not None and v_train is not None and (v_sel + v_train) > 0
    return {
        "n_runs": len(values),
        "selection_seeds": len(by_s),
        "training_seeds": len(by_t),
        "var_selection": v_sel,
        "df_selection": df_sel,
        "var_training": v_train,
        "df_training": df_train,
        "share_selection": (v_sel / (v_sel + v_train)) if both else None,  # type: ignore[operator]
    }
