"""CluSTER step 3 (docs/method.md): k-means with one cluster per data-parallel worker, in three
modes: "exact" (scikit-learn, the authors' settings), "fast" (k-means++ restarts on a projected
sample, then Lloyd passes over all rows in blocks, torch on the CPU) and "faiss"; plus the memory
check that refuses the exact mode where its copy of the features would not fit, and the repair
that gives every empty cluster a member.

Conventions as in method/rows.py: X is N x D float32 (or a NormalizedRows read in blocks), K is
the number of clusters (= world size).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from method.rows import (
    _check_finite,
    _check_k,
    _lazy,
    _matrix,
    _n_distinct_at_least,
    sq_distances_to_own_center,
)
from repro.core.extras import require_extra
from repro.core.interfaces import SelectionError

KMEANS_MODES = ("exact", "fast", "faiss")
_BLOCK = 32768  # rows per torch matmul / index_add_ call (views, no copies; fewer calls win)
_PROJ_DIM = 256  # the fast mode's restarts run on a random projection to this many dims (D > 512)
_RESTARTS, _SAMPLE_ITERS, _FULL_PASSES = 3, 20, 10


def exact_mode_fits(n: int, d: int, available_bytes: int | None = None) -> tuple[bool, float, float]:
    """(fits, needed GiB, available GiB) for scikit-learn's k-means ("exact"): it copies the
    N x D float32 matrix (copy_x) and keeps the input, so about 2 x N x D x 4 bytes plus the
    N x K distances. `available_bytes` defaults to the machine's MemAvailable."""
    need = 2.0 * n * d * 4
    if available_bytes is None:
        available_bytes = _mem_available()
    return need <= available_bytes, need / 2**30, available_bytes / 2**30


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


# -- step 3 ---------------------------------------------------------------------------------------
def kmeans(
    X,
    k: int,
    seed: int,
    n_init: int = 10,
    max_iter: int = 300,
    mode: str = "exact",
    sample: int | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Step 3: k-means with K clusters. Returns (labels int64 [N], centers float32 [K, D], inertia =
    sum of squared distances of ALL points to their own center, squared feature units).

    "exact": sklearn KMeans(k-means++, n_init, max_iter, random_state=seed), the authors' settings.
    "fast": k-means++ restarts on a seeded (randomly projected) sample of `sample` rows (default
    max(256 K, 20000)), then Lloyd passes on all rows (see _fast_kmeans; torch, CPU). Not the same
    partition as "exact"; its inertia is typically within 0.1% of it.
    "faiss": faiss.Kmeans (n_init restarts, max_iter iterations, seeded) trained on a seeded
    sample of `sample` rows (default as "fast"), then every row assigned to its nearest center.
    Both: every cluster ends with >= 1 member (an empty one gets the row farthest from its
    center)."""
    X = _matrix(X)
    n = X.shape[0]
    k = _check_k(k, n)
    if mode not in KMEANS_MODES:
        raise SelectionError(f"unknown k-means mode {mode!r}; choose one of {KMEANS_MODES}")
    _check_finite(X)
    n_distinct = _n_distinct_at_least(X, k)
    if n_distinct < k:
        raise SelectionError(
            f"only {n_distinct} distinct feature rows for K = world size = {k} "
            "clusters; the features are degenerate (duplicates or a constant row)"
        )
    if _lazy(X) and mode != "fast":
        raise SelectionError(
            f"k-means mode {mode!r} needs the {n} x {X.shape[1]} features in memory; this selection "
            "reads them in row blocks from disk: use selection.params.kmeans: fast"
        )
    if mode == "exact":
        from sklearn.cluster import KMeans

        fits, need, avail = exact_mode_fits(n, X.shape[1])
        if not fits:
            raise SelectionError(
                f"k-means mode 'exact' (scikit-learn) copies the {n} x {X.shape[1]} features: "
                f"about {need:.1f} GiB, with {avail:.1f} GiB available; use "
                "selection.params.kmeans: fast (row blocks over the features file, bounded memory)"
            )

        km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, max_iter=max_iter, random_state=seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            km.fit(X)
        for w in caught:
            if "distinct clusters" in str(w.message):
                raise SelectionError(f"k-means found fewer distinct clusters than K = {k}: {w.message}")
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        labels, centers = km.labels_.astype(np.int64), km.cluster_centers_.astype(np.float32)
        inertia = float(km.inertia_)
    elif mode == "faiss":
        labels, centers, inertia = _faiss_kmeans(X, k, seed, n_init, max_iter, sample)
    else:
        labels, centers, inertia = _fast_kmeans(X, k, seed, n_init, max_iter, sample)
    if np.bincount(labels, minlength=k).min() == 0:  # sklearn relocates empties itself
        labels, centers = _repair_empty(X, labels, centers)
        inertia = float(sq_distances_to_own_center(X, centers, labels).sum())
    return labels, centers, inertia


def _fast_kmeans(
    X: np.ndarray, k: int, seed: int, n_init: int, max_iter: int, sample: int | None
) -> tuple[np.ndarray, np.ndarray, float]:
    """The "fast" mode. (1) A seeded sample of s rows (D > 512: projected to 256 dims by a seeded
    Gaussian matrix, which preserves k-means costs up to a small factor) gets greedy k-means++ and
    Lloyd (<= 20 iterations) min(n_init, 3) times; the lowest sample inertia wins; (2) that
    partition is lifted to D dims (centers = means of its sample rows); (3) Lloyd passes on all rows
    in D dims refine it (see _lloyd; at most min(max_iter, 10) passes, usually 3-5). Phases (1)-(2)
    cost about two full passes at N = 75k, D = 4096."""
    import torch
    from threadpoolctl import threadpool_limits

    n, dim = X.shape
    s = min(n, sample if sample else max(256 * k, 20000))
    rng = np.random.default_rng([seed, 3])
    Xs = torch.from_numpy(
        X[np.sort(rng.choice(n, s, replace=False))] if s < n else (X[0:n] if _lazy(X) else X)
    )
    Ys = Xs
    if dim > 2 * _PROJ_DIM:
        proj = rng.standard_normal((dim, _PROJ_DIM)).astype(np.float32) / np.sqrt(_PROJ_DIM)
        Ys = Xs @ torch.from_numpy(proj.astype(np.float32))
    # the restarts are many millisecond-sized ops: one thread (OpenMP barriers in small parallel
    # regions cost up to 10x on a busy 2-core machine); the winner is thread-count independent
    threads, best = torch.get_num_threads(), None
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            for _ in range(max(1, min(n_init, _RESTARTS))):
                init = torch.from_numpy(_kmeans_plusplus(Ys.numpy(), k, rng))
                lab, _, part = _lloyd(Ys, init, _SAMPLE_ITERS, 1e-3)
                if best is None or part < best[1]:
                    best = (lab, part)
    finally:
        torch.set_num_threads(threads)
    counts = torch.bincount(best[0], minlength=k).double()
    centers = (torch.zeros(k, dim).index_add_(0, best[0], Xs).double() / counts.clamp_min(1)[:, None]).float()
    for c in torch.nonzero(counts == 0).flatten().tolist():  # only for a projected duplicate
        centers[c] = Xs[int(rng.integers(s))]
    passes = max(1, min(max_iter, _FULL_PASSES))
    labels, centers, inertia = _lloyd(X if _lazy(X) else torch.from_numpy(X), centers, passes, 1e-4)
    return labels.numpy().astype(np.int64), centers.numpy().astype(np.float32), inertia


def _faiss_kmeans(
    X: np.ndarray, k: int, seed: int, n_init: int, max_iter: int, sample: int | None
) -> tuple[np.ndarray, np.ndarray, float]:
    """The "faiss" mode: faiss's k-means (its own random init, n_init restarts keeping the lowest
    objective) on a seeded sample, then one exact assignment of all rows. Uses the GPU build's
    devices when faiss has them."""
    require_extra("faiss", "k-means mode 'faiss'")
    import faiss

    n, dim = X.shape
    s = min(n, sample if sample else max(256 * k, 20000))
    rng = np.random.default_rng([seed, 5])
    Xs = X[np.sort(rng.choice(n, s, replace=False))] if s < n else X
    km = faiss.Kmeans(
        dim,
        k,
        niter=max_iter,
        nredo=max(1, n_init),
        seed=int(seed) % 2**31,
        max_points_per_centroid=max(1, -(-s // k)),
        verbose=False,
        gpu=faiss.get_num_gpus() > 0,
    )
    km.train(np.ascontiguousarray(Xs, dtype=np.float32))
    dist, lab = km.index.search(X, 1)
    labels = lab[:, 0].astype(np.int64)
    centers = np.ascontiguousarray(km.centroids, dtype=np.float32)
    inertia = float(sq_distances_to_own_center(X, centers, labels).sum())
    return labels, centers, inertia


def _kmeans_plusplus(Y: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Greedy k-means++ seeding (2 + ln k candidate draws per center, keep the one that lowers the
    potential most), in float32 via the |y|^2 - 2 y.c + |c|^2 expansion. Returns k x d centers."""
    ysq = np.einsum("ij,ij->i", Y, Y)
    first = int(rng.integers(Y.shape[0]))
    closest = np.maximum(ysq - 2.0 * (Y @ Y[first]) + ysq[first], 0).astype(np.float64)
    chosen, trials = [first], 2 + int(np.log(k))
    for _ in range(1, k):
        cum = np.cumsum(closest)
        cand = np.minimum(np.searchsorted(cum, rng.random(trials) * cum[-1]), Y.shape[0] - 1)
        d = np.maximum(ysq[:, None] - 2.0 * (Y @ Y[cand].T) + ysq[cand], 0)
        pots = np.minimum(closest[:, None], d).sum(0)
        j = int(np.argmin(pots))
        chosen.append(int(cand[j]))
        closest = np.minimum(closest, d[:, j])
    return np.ascontiguousarray(Y[chosen], dtype=np.float32)


def _lloyd(Xt, C, n_pass: int, tol: float):
    """Lloyd iterations on the rows of Xt (torch, float32 matmul in row blocks) from centers C.
    One pass over the rows per iteration does both halves: assign each row to its nearest center
    and accumulate the per-cluster sums that give the next centers. Stops after n_pass passes, or
    when at most tol * N labels change or the inertia fell by less than tol / 10 (relative) in the
    last pass. Returns (labels, centers, inertia): labels are the argmin for the returned centers,
    inertia the sum of their squared distances (float64)."""
    import torch

    n, k = Xt.shape[0], C.shape[0]
    if not torch.is_tensor(Xt):  # NormalizedRows: each block made when read
        rows = Xt

        class _Blocks:
            shape = rows.shape

            def __getitem__(self, s):
                return torch.from_numpy(rows[s])

        Xt = _Blocks()
    narrow = Xt.shape[1] <= 512  # index_add_ has a per-row overhead: a one-hot matmul wins there
    blocks = [slice(b, min(b + _BLOCK, n)) for b in range(0, n, _BLOCK)]
    # inertia = sum_i |x_i|^2 + sum_i part_i, part_i = |c|^2 - 2 x_i.c for the row's center
    # (per-row norms: a float32 norm over a whole 32768 x 4096 block is off by ~3%)
    total_sq = sum(float(torch.linalg.vector_norm(Xt[s], dim=1).double().pow(2).sum()) for s in blocks)
    labels = torch.full((n,), -1, dtype=torch.int64)
    part = torch.empty(n)
    prev = math.inf
    for it in range(max(1, n_pass)):
        cn = (C.double() ** 2).sum(1).float()
        sums = torch.zeros(k, Xt.shape[1], dtype=torch.float64)
        changed = 0
        for s in blocks:
            xb = Xt[s]
            part[s], lb = (cn - 2.0 * (xb @ C.T)).min(1)  # |x|^2 is common to all centers
            changed += int((lb != labels[s]).sum())
            labels[s] = lb
            # float32 sums per block, added in float64 across blocks (rounding stays block-sized)
            if it == n_pass - 1:
                continue  # the last pass only assigns
            if narrow:
                sums += (torch.nn.functional.one_hot(lb, k).T.float() @ xb).double()
            else:
                sums += torch.zeros(k, Xt.shape[1]).index_add_(0, lb, xb).double()
        inertia = max(total_sq + float(part.sum(dtype=torch.float64)), 0.0)
        if changed <= n * tol or prev - inertia <= 0.1 * tol * inertia or it == n_pass - 1:
            break
        prev = inertia
        counts = torch.bincount(labels, minlength=k).double()[:, None]
        # an empty cluster keeps its center (kmeans() repairs one still empty at the end)
        C = torch.where(counts > 0, sums / counts.clamp_min(1), C.double()).float()
    return labels, C, inertia


def _repair_empty(X, labels, centers):
    """Give every empty cluster one member: the row farthest from its own center among clusters with
    >= 2 members; the emptied cluster's center becomes that row."""
    k = centers.shape[0]
    sizes = np.bincount(labels, minlength=k)
    if sizes.min() > 0:
        return labels, centers
    labels, centers = labels.copy(), centers.copy()
    far = sq_distances_to_own_center(X, centers, labels)
    for c in np.flatnonzero(sizes == 0):
        far_ok = np.where(sizes[labels] >= 2, far, -np.inf)
        i = int(np.argmax(far_ok))
        sizes[labels[i]] -= 1
        labels[i], sizes[c], far[i] = c, 1, -np.inf
        centers[c] = X[i]
    return labels, centers
