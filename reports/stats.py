"""Means with bootstrap confidence intervals, and paired bootstrap intervals for differences.

Deterministic: each interval draws from a generator seeded by a stable hash of what it describes
(the cell and the column), so the same results give the same intervals, and adding a run to one
cell does not move another cell's interval.

- `mean_ci(values)`: mean over seeds with a 95% percentile bootstrap interval of the mean
  (resampling seeds). One value: no interval (the table marks the cell single-seed). With two or
  three seeds the interval is coarse (it can only take a few values): read it as a range.
- `paired_diff(groups)`: the mean difference (method minus reference) over paired units with a
  95% percentile bootstrap interval. Units are items (per-item scores of both runs, same seed) or,
  where per-item scores are absent, seeds. Several groups (e.g. the benchmarks of a domain
  average) are resampled each within itself and their means averaged, as the average is formed.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

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
