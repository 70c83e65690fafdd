"""Benchmark of CluSTER steps 2-6 (normalize, k-means, soft cap, budget + choice) at the paper's
scale: N = 75,197 (Magicoder-OSS-Instruct-75K), D = 4096 (7B hidden size), K = 4 and 8 workers.

    python -m repro.bench.cluster                    # the full run (several minutes: sklearn)
    python -m repro.bench.cluster --n 20000 --d 1024 --modes fast

Features are seeded random unit vectors (float32). On them every partition has nearly the same
inertia, so the "random/exact" column (inertia of a random partition with its means, over the
exact inertia) is printed to show how little the fast/exact ratio can discriminate here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from method import clustering as C


def _unit_vectors(n: int, d: int, seed: int) -> np.ndarray:
    X = np.random.default_rng(seed).standard_normal((n, d), dtype=np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X


def _pipeline(X: np.ndarray, k: int, mode: str, seed: int) -> dict:
    """Steps 2-6 as the selector runs them (cap 1.5, prune close, ratio 50), timed per step (s)."""
    t0 = time.perf_counter()
    Xn = C.normalize_features(X, k)
    t1 = time.perf_counter()
    labels, centers, inertia = C.kmeans(Xn, k, seed, mode=mode)
    t2 = time.perf_counter()
    capped = C.soft_cap_assign(Xn, centers, labels)
    t3 = time.perf_counter()
    _, m_adj = C.balanced_budget(np.bincount(capped, minlength=k), 50)
    C.choose_within_cluster(Xn, centers, capped, m_adj, "close", seed)
    t4 = time.perf_counter()
    # the cap's greedy path never runs on balanced clusters: time it once with everything in one
    # cluster (the worst case: every row is reassigned)
    t5 = time.perf_counter()
    C.soft_cap_assign(Xn, centers, np.zeros(len(Xn), dtype=np.int64))
    t6 = time.perf_counter()
    return {
        "k": k,
        "mode": mode,
        "n": len(X),
        "d": X.shape[1],
        "normalize_s": t1 - t0,
        "kmeans_s": t2 - t1,
        "cap_s": t3 - t2,
        "choice_s": t4 - t3,
        "total_s": t4 - t0,
        "cap_forced_s": t6 - t5,
        "inertia": inertia,
        "m_adj": m_adj,
        "sizes": np.bincount(capped, minlength=k).tolist(),
        "labels": labels,
        "Xn": Xn,
    }


def bench_cluster(
    n: int = 75197,
    d: int = 4096,
    ks=(4, 8),
    modes=("exact", "fast"),
    seed: int = 0,
    n_growth=(10000, 25000, 75197),
) -> list[dict]:
    """One row per (K, mode) at N = n ("kind": "main"), then the fast mode's rows at each N in
    n_growth ("kind": "growth"). Times in seconds (wall clock); "load1" is the 1-minute load
    average when the row started (other jobs on the machine inflate every time)."""
    import torch  # noqa: F401  (import and first-call costs are not the method's)

    X = _unit_vectors(max([n, *n_growth]), d, seed)
    C.kmeans(X[:2000, :64], 4, 0, mode="fast")
    rows = []
    for k in ks:
        exact = None
        for mode in modes:
            load = os.getloadavg()[0]
            r = _pipeline(X[:n], k, mode, seed)
            Xn, labels = r.pop("Xn"), r.pop("labels")
            r.update(kind="main", load1=load, threads=torch.get_num_threads())
            if mode == "exact":
                exact = r["inertia"]
                rand = np.random.default_rng(seed).integers(0, k, len(Xn))
                means = np.stack([Xn[rand == c].mean(axis=0) for c in range(k)])
                r["random_over_exact"] = float(C.sq_distances_to_own_center(Xn, means, rand).sum()) / exact
            rows.append(r)
            _progress(r)
            del Xn, labels
        for r in rows:
            if r["k"] == k and exact:
                r["fast_over_exact"] = r["inertia"] / exact
    for k in ks:
        for ng in n_growth:
            load = os.getloadavg()[0]
            r = _pipeline(X[:ng], k, "fast", seed)
            r.pop("Xn"), r.pop("labels")
            r.update(kind="growth", load1=load, threads=torch.get_num_threads())
            rows.append(r)
            _progress(r)
    return rows


def _progress(r: dict) -> None:
    print(
        f"[bench_cluster] {r['kind']} N={r['n']} K={r['k']} {r['mode']}: kmeans "
        f"{r['kmeans_s']:.1f} s, total {r['total_s']:.1f} s, inertia {r['inertia']:.2f}, "
        f"load {r['load1']:.1f}",
        file=sys.stderr,
        flush=True,
    )


def format_cluster(rows: list[dict]) -> str:
    """A Markdown table of bench_cluster rows."""
    cols = [
        ("kind", "kind", "{}"),
        ("N", "n", "{:,}"),
        ("D", "d", "{}"),
        ("K", "k", "{}"),
        ("mode", "mode", "{}"),
        ("normalize s", "normalize_s", "{:.2f}"),
        ("kmeans s", "kmeans_s", "{:.2f}"),
        ("cap s", "cap_s", "{:.2f}"),
        ("budget+choice s", "choice_s", "{:.2f}"),
        ("total s", "total_s", "{:.2f}"),
        ("cap forced s", "cap_forced_s", "{:.2f}"),
        ("inertia", "inertia", "{:.2f}"),
        ("fast/exact", "fast_over_exact", "{:.6f}"),
        ("random/exact", "random_over_exact", "{:.6f}"),
        ("load1", "load1", "{:.1f}"),
    ]
    out = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append(
            "| " + " | ".join(f.format(r[key]) if r.get(key) is not None else "" for _, key, f in cols) + " |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=75197)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--modes", nargs="+", default=["exact", "fast"], choices=C.KMEANS_MODES)
    ap.add_argument("--growth", type=int, nargs="*", default=[10000, 25000, 75197])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)
    rows = bench_cluster(a.n, a.d, tuple(a.ks), tuple(a.modes), a.seed, tuple(a.growth))
    print(format_cluster(rows), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
