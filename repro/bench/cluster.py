"""Benchmark of CluSTER steps 2-6 (normalize, k-means, soft cap, budget + choice) at the paper's
scale: N = 75,197 (Magicoder-OSS-Instruct-75K), D = 4096 (7B hidden size), K = 4 and 8 workers.

    python -m repro.bench.cluster                    # the full run (several minutes: sklearn)
    python -m repro.bench.cluster --n 20000 --d 1024 --modes fast

Features are seeded random unit vectors (float32). On them every partition has nearly the same
inertia, so the "random/exact" column (inertia of a random partition with its means, over the
exact inertia) is printed to show how little the fast/exact ratio can discriminate here.

At pool scale (issue 24), the selector's bounded-memory path over a features file:

    python -m repro.bench.cluster --scale --n 1000000 --d 4096 --ks 8 --folder /tmp/x --agree-n 200000

writes a seeded N x D float32 mixture (32 latent groups, row norms spread 0.5-2) to
FOLDER/features.npy in blocks, then runs steps 2-6 as the selector does with kmeans fast
(method.rows.NormalizedRows: no N x D copy), sampling this process's anonymous and
file-backed resident memory (RssAnon, RssFile) every 0.1 s; --agree-n also runs the first rows
both in memory and over the file, and reports whether labels and kept sets agree. The file is
deleted afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from method import clustering as C
from method.kmeans import KMEANS_MODES, kmeans
from method.rows import (
    ROW_CHUNK,
    NormalizedRows,
    normalize_features,
    project_features,
    sq_distances_to_own_center,
)
from reports.render import plain_table
from repro.core.argtypes import int_list, int_range, positive_int, rng_seed, str_list


def _unit_vectors(n: int, d: int, seed: int) -> np.ndarray:
    X = np.random.default_rng(seed).standard_normal((n, d), dtype=np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X


def _pipeline(X: np.ndarray, k: int, mode: str, seed: int) -> dict:
    """Steps 2-6 as the selector runs them (cap 1.5, prune close, ratio 50), timed per step (s)."""
    t0 = time.perf_counter()
    Xn = normalize_features(X, k)
    t1 = time.perf_counter()
    labels, centers, inertia = kmeans(Xn, k, seed, mode=mode)
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
    kmeans(X[:2000, :64], 4, 0, mode="fast")
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
                r["random_over_exact"] = float(sq_distances_to_own_center(Xn, means, rand).sum()) / exact
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


class _RssSampler:
    """The peak RssAnon and RssFile of this process (MiB), sampled every `every` s in a thread."""

    def __init__(self, every: float = 0.1) -> None:
        import threading

        self.peak = {"RssAnon": 0.0, "RssFile": 0.0}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _read(self) -> None:
        with open("/proc/self/status") as fh:
            for line in fh:
                key = line.split(":")[0]
                if key in self.peak:
                    self.peak[key] = max(self.peak[key], int(line.split()[1]) / 1024)

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self._read()

    def __enter__(self) -> _RssSampler:
        self._read()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self._read()


def write_mixture(path, n: int, d: int, seed: int, groups: int = 32, block: int = 65536) -> None:
    """A seeded N x D float32 .npy of `groups` Gaussian groups (unit-variance noise around
    centers of norm 4 sqrt(D)... scaled), rows scaled by 0.5-2, written in blocks of rows."""
    rng = np.random.default_rng([seed, 1])
    centers = rng.standard_normal((groups, d)).astype(np.float32)
    share = rng.dirichlet(np.full(groups, 2.0))
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    for a in range(0, n, block):
        m = min(block, n - a)
        g = rng.choice(groups, m, p=share)
        xb = rng.standard_normal((m, d), dtype=np.float32)
        xb *= np.float32(0.8)
        xb += centers[g]
        xb *= rng.uniform(0.5, 2.0, (m, 1)).astype(np.float32)
        mm[a : a + m] = xb
    mm.flush()
    del mm


def _steps(Xn, X, k: int, seed: int) -> tuple[dict, dict[int, np.ndarray], np.ndarray]:
    """Steps 3-6 as the selector runs them (fast k-means, cap 1.5, prune close, ratio 50)."""
    t1 = time.perf_counter()
    labels, centers, inertia = kmeans(Xn, k, seed, mode="fast")
    t2 = time.perf_counter()
    capped = C.soft_cap_assign(Xn, centers, labels)
    t3 = time.perf_counter()
    _, m_adj = C.balanced_budget(np.bincount(capped, minlength=k), 50)
    chosen = C.choose_within_cluster(Xn, centers, capped, m_adj, "close", seed)
    t4 = time.perf_counter()
    return (
        {"kmeans_s": t2 - t1, "cap_s": t3 - t2, "choice_s": t4 - t3, "inertia": inertia, "m_adj": m_adj},
        chosen,
        capped,
    )


def bench_scale(n: int, d: int, k: int, folder: str, seed: int = 0, agree_n: int | None = None) -> list[dict]:
    """Rows: "scale" (the bounded path over the file at N x D) and, with agree_n, "agreement"
    (the first agree_n rows in memory vs over the file: kept-set Jaccard, labels equal)."""
    from pathlib import Path

    import torch

    path = Path(folder) / "features.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    write_mixture(path, n, d, seed)
    write_s = time.perf_counter() - t0
    rows = []
    kmeans(np.random.default_rng(0).standard_normal((2000, 64)).astype(np.float32), 4, 0, mode="fast")
    load = os.getloadavg()[0]
    X = np.load(path, mmap_mode="r")
    with _RssSampler() as rss:
        base = dict(rss.peak)
        t0 = time.perf_counter()
        Xn = NormalizedRows(X, k)
        t1 = time.perf_counter()
        r, chosen, capped = _steps(Xn, X, k, seed)
        total = time.perf_counter() - t0
    r.update(
        kind="scale",
        mode="fast, over the file",
        n=n,
        d=d,
        k=k,
        normalize_s=t1 - t0,
        total_s=total,
        write_s=write_s,
        file_gb=path.stat().st_size / 1e9,
        rss_anon_peak_mb=rss.peak["RssAnon"],
        rss_anon_before_mb=base["RssAnon"],
        rss_file_peak_mb=rss.peak["RssFile"],
        load1=load,
        load1_after=os.getloadavg()[0],
        threads=torch.get_num_threads(),
        sizes=np.bincount(capped, minlength=k).tolist(),
    )
    rows.append(r)
    print(f"[bench_cluster] scale {r}", file=sys.stderr, flush=True)
    if agree_n:
        rows.append(_agreement(X[: min(agree_n, n)], k, seed, Path(folder)))
    del X, Xn
    return rows


def _kept(chosen: dict[int, np.ndarray]) -> set[int]:
    return set(np.concatenate(list(chosen.values())).tolist())


def _agreement(head: np.ndarray, k: int, seed: int, folder) -> dict:
    """The first rows (a memmap view of the file) in memory (normalize_features: an in-memory
    N x D copy) vs over the file (NormalizedRows), vs float16 storage, vs a 256-dim random
    projection: kept-set Jaccard and the ARI of the capped labels against the in-memory run."""
    from sklearn.metrics import adjusted_rand_score

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    mem, mem_chosen, mem_lab = _steps(normalize_features(head, k), head, k, seed)
    mem_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    lazy, lazy_chosen, lazy_lab = _steps(NormalizedRows(head, k), head, k, seed)
    lazy_s = time.perf_counter() - t0
    half_path = folder / "head16.npy"
    half = np.lib.format.open_memmap(half_path, mode="w+", dtype=np.float16, shape=head.shape)
    for a in range(0, head.shape[0], ROW_CHUNK):
        half[a : a + ROW_CHUNK] = head[a : a + ROW_CHUNK]
    half.flush()
    _, half_chosen, half_lab = _steps(NormalizedRows(half, k), half, k, seed)
    del half
    half_path.unlink()
    row = {
        "kind": "agreement",
        "mode": "fast: in memory vs over the file",
        "n": head.shape[0],
        "d": head.shape[1],
        "k": k,
        "total_s": lazy_s,
        "in_memory_s": mem_s,
        "kept_jaccard": len(_kept(mem_chosen) & _kept(lazy_chosen))
        / len(_kept(mem_chosen) | _kept(lazy_chosen)),
        "labels_equal": bool(np.array_equal(mem_lab, lazy_lab)),
        "inertia": lazy["inertia"],
        "inertia_in_memory": mem["inertia"],
        "f16_kept_jaccard": len(_kept(mem_chosen) & _kept(half_chosen))
        / len(_kept(mem_chosen) | _kept(half_chosen)),
        "f16_ari": float(adjusted_rand_score(mem_lab, half_lab)),
        "load1": load,
    }
    if head.shape[1] > 256:
        P = project_features(NormalizedRows(head, k), 256, seed)
        _, proj_chosen, proj_lab = _steps(P, P, k, seed)
        row["proj256_kept_jaccard"] = len(_kept(mem_chosen) & _kept(proj_chosen)) / len(
            _kept(mem_chosen) | _kept(proj_chosen)
        )
        row["proj256_ari"] = float(adjusted_rand_score(mem_lab, proj_lab))
    print(f"[bench_cluster] agreement {row}", file=sys.stderr, flush=True)
    return row


def format_scale(rows: list[dict]) -> str:
    cols = [
        ("kind", "kind", "{}"),
        ("N", "n", "{:,}"),
        ("D", "d", "{}"),
        ("K", "k", "{}"),
        ("file GB", "file_gb", "{:.1f}"),
        ("normalize s", "normalize_s", "{:.1f}"),
        ("kmeans s", "kmeans_s", "{:.1f}"),
        ("cap s", "cap_s", "{:.1f}"),
        ("choice s", "choice_s", "{:.1f}"),
        ("total s", "total_s", "{:.1f}"),
        ("in-memory s", "in_memory_s", "{:.1f}"),
        ("RssAnon peak MiB", "rss_anon_peak_mb", "{:,.0f}"),
        ("RssFile peak MiB", "rss_file_peak_mb", "{:,.0f}"),
        ("kept Jaccard", "kept_jaccard", "{:.4f}"),
        ("labels equal", "labels_equal", "{}"),
        ("f16 kept Jaccard", "f16_kept_jaccard", "{:.4f}"),
        ("f16 ARI", "f16_ari", "{:.4f}"),
        ("JL-256 kept Jaccard", "proj256_kept_jaccard", "{:.4f}"),
        ("JL-256 ARI", "proj256_ari", "{:.4f}"),
        ("load1", "load1", "{:.1f}"),
    ]
    return plain_table(cols, rows)


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
    return plain_table(cols, rows)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--n", type=positive_int, default=75197, help="rows (pool size)")
    ap.add_argument("--d", type=int_range(2, note="unit vectors in 1 dim are only +-1"), default=4096)
    ap.add_argument(
        "--ks",
        type=int_list(lo=1),
        default="4,8",
        help="K: clusters = workers, comma-separated (default 4,8)",
    )
    ap.add_argument(
        "--modes",
        type=str_list(KMEANS_MODES),
        default=",".join(("exact", "fast")),
        help="k-means modes, comma-separated (default exact,fast)",
    )
    ap.add_argument(
        "--growth",
        type=int_list(lo=1, empty_ok=True),
        default="10000,25000,75197",
        help="the fast mode again at these N, comma-separated ('' for none)",
    )
    ap.add_argument("--seed", type=rng_seed, default=0)
    ap.add_argument("--out", help="also write the rows here (JSON)")
    ap.add_argument("--scale", action="store_true", help="the bounded-memory path over a features file")
    ap.add_argument("--folder", help="--scale: where the N x D features file is written (deleted after)")
    ap.add_argument(
        "--agree-n", type=positive_int, help="--scale: compare in memory vs over the file at this N"
    )
    ap.add_argument("--keep", action="store_true", help="--scale: keep the features file")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="cluster-repro bench cluster", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    add_arguments(ap)
    return ap


def run(a: argparse.Namespace) -> int:
    # K-means needs at least K rows at every N this bench runs
    for flag, n in (("--n", a.n), *(("--growth", g) for g in ([] if a.scale else a.growth))):
        if n < max(a.ks):
            parser().error(
                f"{flag} {n}: fewer rows than the --ks {max(a.ks)} clusters; use at least {max(a.ks)}"
            )
    if a.agree_n is not None and a.agree_n > a.n:
        parser().error(f"--agree-n {a.agree_n}: more rows than --n {a.n}")
    if a.scale:
        if not a.folder:
            parser().error("--scale needs --folder (an N x D x 4-byte file is written there)")
        from pathlib import Path

        try:
            rows = []
            for k in a.ks:
                rows += bench_scale(a.n, a.d, k, a.folder, a.seed, a.agree_n)
        finally:
            if not a.keep:
                (Path(a.folder) / "features.npy").unlink(missing_ok=True)
        print(format_scale(rows), flush=True)
    else:
        rows = bench_cluster(a.n, a.d, tuple(a.ks), tuple(a.modes), a.seed, tuple(a.growth))
        print(format_cluster(rows), flush=True)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
