"""Means with bootstrap confidence intervals, and paired bootstrap intervals for differences.

Deterministic: each interval draws from a generator seeded by a stable hash of what it describes
(the cell and the column), so the same results give the same intervals, and adding a run to one
cell does not move another cell's interval.

- `mean_ci(values)`: mean over seeds with a 95% percentile bootstrap interval of the mean
  (resampling seeds). One value: no interval (the table marks the cell single-seed). With two or
  three seeds the interval is coarse (it can only take a few values): read it as a range.
- `jaccard`, `spearman` (ties as scipy's average ranks), `pooled_variance` and `variance_split`
  (a metric's spread over selection seeds vs training seeds): the analyses' statistics.
- `paired_diff(groups)`: the mean difference (method minus reference) over paired units with a
  95% percentile bootstrap interval. Units are items (per-item scores of both runs, same seed) or,
  where per-item scores are absent, seeds. Several groups (e.g. the benchmarks of a domain
  average) are resampled each within itself and their means averaged, as the average is formed.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

N_BOOT = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A mean (or mean difference) with its interval; lo/hi are None without one."""

    value: float
    lo: float | None = None
    hi: float | None = None
    n: int = 1  # seeds (mean_ci) or paired units (paired_diff)
    unit: str = "seeds"

    @property
    def single(self) -> bool:
        return self.n < 2


def _rng(key: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(key.encode("utf-8")))


def _boot_means(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """N_BOOT means of resamples of a, drawn in chunks so memory stays bounded (~16 MB) even for
    benchmarks with thousands of items."""
    out = np.empty(N_BOOT)
    step = max(1, 2_000_000 // a.size)
    for start in range(0, N_BOOT, step):
        k = min(step, N_BOOT - start)
        out[start : start + k] = a[rng.integers(0, a.size, size=(k, a.size))].mean(axis=1)
    return out


def _interval(boot: np.ndarray) -> tuple[float, float]:
    a = (1 - LEVEL) / 2
    lo, hi = np.quantile(boot, [a, 1 - a])
    return float(lo), float(hi)


def mean_ci(values: list[float], key: str) -> Estimate | None:
    """Mean of the seeds' values with a bootstrap interval; None when there are no values."""
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return None
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, n=1)
    lo, hi = _interval(_boot_means(x, _rng(key)))
    return Estimate(mean, lo, hi, n=int(x.size))


def paired_diff(groups: list[np.ndarray], key: str, unit: str) -> Estimate | None:
    """Mean over groups of the mean paired difference, with a bootstrap interval.

    groups: one array of differences per benchmark (or one array of per-seed differences).
    None when any group is empty (a missing benchmark leaves the difference missing too).
    """
    if not groups or any(len(g) == 0 for g in groups):
        return None
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    value = float(np.mean([a.mean() for a in arrays]))
    n = min(a.size for a in arrays)
    if n < 2:
        return Estimate(value, n=n, unit=unit)
    rng = _rng(key)
    boot = np.zeros(N_BOOT)
    for a in arrays:
        boot += _boot_means(a, rng)
    lo, hi = _interval(boot / len(arrays))
    return Estimate(value, lo, hi, n=n, unit=unit)


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
