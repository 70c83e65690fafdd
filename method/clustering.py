"""CluSTER steps 2-6, 8 and 9 (see docs/method.md): normalize the gradient features, k-means
with one cluster per data-parallel worker, the soft capacity cap, the balanced budget, the choice
inside each cluster, the rank weights and the uniform (up-sampling) variant.

Conventions: X is N x D (float32; converted when not), indices are row indices into X, K is the
number of clusters (= world size). Squared Euclidean distances are in squared feature units
(float64 results from float32 products; see pairwise_sq_distances).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from repro.core.extras import require_extra
from repro.core.interfaces import SelectionError

NORM_MODES = ("auto", "l2", "center", "none")
KMEANS_MODES = ("exact", "fast", "faiss")
PRUNE_MODES = ("close", "far", "rand", "mix", "big", "none")
_BLOCK = 32768  # rows per torch matmul / index_add_ call (views, no copies; fewer calls win)
_PROJ_DIM = 256  # the fast mode's restarts run on a random projection to this many dims (D > 512)
_RESTARTS, _SAMPLE_ITERS, _FULL_PASSES = 3, 20, 10


# -- helpers --------------------------------------------------------------------------------------
def _matrix(X) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2:
        raise SelectionError(f"features must be a 2-D array (N x D), got shape {X.shape}")
    return np.ascontiguousarray(X, dtype=np.float32)


def _check_finite(X: np.ndarray) -> None:
    """SelectionError naming the bad rows if any entry is NaN or +-inf. One random projection, not
    an N x D mask (1.2 GB at 75k x 4096): NaN/inf always makes the row's projection non-finite;
    flagged rows are checked exactly (a finite row whose projection overflows is cleared)."""
    r = np.random.default_rng(0).standard_normal(X.shape[1]).astype(np.float32) + 1.0
    with np.errstate(all="ignore"):
        cand = np.flatnonzero(~np.isfinite(X @ r))
    bad = cand[~np.isfinite(X[cand]).all(axis=1)] if cand.size else cand
    if bad.size:
        raise SelectionError(
            f"{bad.size} feature row(s) contain NaN or inf (first bad row index: "
            f"{int(bad[0])}); the feature extraction failed for those examples"
        )


def _sq_norms(X: np.ndarray) -> np.ndarray:
    """Squared L2 norm of every row, float64. Products in float32 (a float64 copy of X costs ~10x
    at 75k x 4096); rows whose float32 result leaves 1e-30..1e30 are redone in float64."""
    sq = np.einsum("ij,ij->i", X, X).astype(np.float64)
    odd = np.flatnonzero(~((sq > 1e-30) & (sq < 1e30)))
    if odd.size:
        xo = X[odd].astype(np.float64)
        sq[odd] = np.einsum("ij,ij->i", xo, xo)
    return sq


def _check_k(k, n: int) -> int:
    if int(k) != k or k < 1:
        raise SelectionError(f"K = world size = {k} must be a positive integer")
    if k > n:
        raise SelectionError(f"K = world size = {k} is larger than the pool ({n})")
    return int(k)


def _check_labels(labels, n: int, k: int) -> np.ndarray:
    labels = np.asarray(labels, dtype=np.int64)
    if labels.shape != (n,):
        raise SelectionError(f"labels must have shape ({n},), got {labels.shape}")
    if n and (labels.min() < 0 or labels.max() >= k):
        raise SelectionError(f"labels must lie in 0..{k - 1}")
    return labels


def _n_distinct_at_least(X: np.ndarray, k: int) -> int:
    """The number of distinct rows if it is below k, else some count >= k. Cheap in the common case:
    a column's distinct values (exact comparisons, no arithmetic) bound the distinct rows from
    below; the exact np.unique over rows runs only when no column reaches k."""
    for j in range(min(X.shape[1], 8)):
        if np.unique(X[:, j]).size >= k:
            return k
    return int(np.unique(X, axis=0).shape[0])


def pairwise_sq_distances(X, centers) -> np.ndarray:
    """[N, K] squared distances (float64, squared feature units) from every row to every center, as
    |x|^2 + |c|^2 - 2 x.c with the products in float32 (float64 when they could overflow). The soft
    cap and its reference both use it, so both see identical numbers (ties included)."""
    X, C = _matrix(X), np.asarray(centers, dtype=np.float32)
    xsq, cn = _sq_norms(X), _sq_norms(C)
    if X.shape[0] and xsq.max() * max(cn.max(), 1.0) < 1e60:
        dots = (X @ C.T).astype(np.float64)
    else:
        dots = np.concatenate(
            [X[b : b + 4096].astype(np.float64) @ C.T.astype(np.float64) for b in range(0, X.shape[0], 4096)]
            or [np.empty((0, len(C)))]
        )
    out = xsq[:, None] + cn - 2.0 * dots
    return np.maximum(out, 0.0, out=out)  # cancellation can give -1e-7 for a point on its center


def sq_distances_to_own_center(X, centers, labels) -> np.ndarray:
    """[N] squared distance (float64, squared feature units) from each row to its own center."""
    X = _matrix(X)
    labels = _check_labels(labels, X.shape[0], np.asarray(centers).shape[0])
    return pairwise_sq_distances(X, centers)[np.arange(X.shape[0]), labels]


# -- step 2 ---------------------------------------------------------------------------------------
def normalize_features(X, k: int, mode: str = "auto") -> np.ndarray:
    """Step 2. "auto": K > 1 -> L2-normalize each row (unit norm); K == 1 -> subtract the mean row.
    Also "l2", "center", "none" (a float32 copy). Returns a new float32 N x D array."""
    if mode not in NORM_MODES:
        raise SelectionError(f"unknown normalization {mode!r}; choose one of {NORM_MODES}")
    if int(k) != k or k < 1:
        raise SelectionError(f"K = world size = {k} must be a positive integer")
    X = _matrix(X)
    _check_finite(X)
    if mode == "auto":
        mode = "l2" if k > 1 else "center"
    if mode == "l2":
        norms = np.sqrt(_sq_norms(X))
        zero = np.flatnonzero(norms == 0)
        if zero.size:
            raise SelectionError(
                f"{zero.size} feature row(s) are all zeros (first: row "
                f"{int(zero[0])}); they cannot be L2-normalized (empty response?)"
            )
        with np.errstate(all="ignore"):
            out = X / norms.astype(np.float32)[:, None]
        odd = np.flatnonzero(~((norms > 1e-30) & (norms < 1e30)))  # norm not a safe float32
        out[odd] = (X[odd] / norms[odd, None]).astype(np.float32)
        return out
    if mode == "center":
        return X - X.mean(axis=0, dtype=np.float64).astype(np.float32)
    return X.copy()


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
    if mode == "exact":
        from sklearn.cluster import KMeans

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
    Xs = torch.from_numpy(X[np.sort(rng.choice(n, s, replace=False))] if s < n else X)
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
    labels, centers, inertia = _lloyd(torch.from_numpy(X), centers, passes, 1e-4)
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


# -- step 4 ---------------------------------------------------------------------------------------
def soft_cap_assign(X, centers, labels, cap_factor: float = 1.5, n_candidates: int = 8) -> np.ndarray:
    """Step 4. If the largest cluster has more than cap_factor * N / K members, reassign every row
    with the same centers under cap = ceil(cap_factor * N / K): all (row, candidate) pairs, the
    candidates being each row's n_candidates nearest centers, in increasing squared distance
    (stable: ties by row index, then candidate rank); a row takes its candidate if still unassigned
    and the center has room. Rows left over go to their nearest center with room, else to their
    nearest center. Otherwise returns a copy of labels. Returns int64 labels [N]."""
    X = _matrix(X)
    n, k = X.shape[0], np.asarray(centers).shape[0]
    labels = _check_labels(labels, n, k)
    if not cap_factor > 0 or n_candidates < 1:
        raise SelectionError(f"need cap_factor > 0 and n_candidates >= 1, got {cap_factor}, {n_candidates}")
    cap = math.ceil(cap_factor * n / k)
    if n == 0 or np.bincount(labels, minlength=k).max() <= cap_factor * n / k:
        return labels.copy()
    d = pairwise_sq_distances(X, centers)
    order = np.argsort(d, axis=1, kind="stable")  # each row's centers, nearest first (ties: index)
    nc = min(int(n_candidates), k)
    cand = order[:, :nc]
    flat = np.argsort(np.take_along_axis(d, cand, 1).ravel(), kind="stable")  # pair p = i*nc + r
    pair_rows, pair_ctrs = (flat // nc).tolist(), cand.ravel()[flat].tolist()
    out = [-1] * n
    room = [cap] * k
    left = n
    for i, c in zip(pair_rows, pair_ctrs):  # the greedy pass (the one sequential part)
        if out[i] < 0 and room[c] > 0:
            out[i] = c
            room[c] -= 1
            left -= 1
            if left == 0:
                break
    out = np.array(out, dtype=np.int64)
    for i in np.flatnonzero(out < 0).tolist():  # only when K > n_candidates or cap * K < N
        with_room = [c for c in order[i].tolist() if room[c] > 0]
        out[i] = with_room[0] if with_room else order[i, 0]
        if with_room:
            room[out[i]] -= 1
    return out


# -- steps 5-6 ------------------------------------------------------------------------------------
def balanced_budget(sizes, ratio: float, micro_batch: int = 1, drop_last: bool = False) -> tuple[int, int]:
    """Step 5. Returns (m, m_adj): m = smallest cluster size, m_adj = floor(m * ratio / 100),
    rounded down to a multiple of micro_batch when `drop_last` (the `cluster` selector passes its
    round_budget_to_batch switch, by default train.drop_last).
    Every cluster then keeps m_adj rows (kept fraction K * m_adj / N)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size == 0:
        raise SelectionError("no clusters: the cluster-size list is empty")
    if not 0 < ratio <= 100:
        raise SelectionError(
            f"ratio = {ratio}: ratio is a percentage in 1..100, e.g. 50 for the paper's r = 0.5"
        )
    if int(micro_batch) != micro_batch or micro_batch < 1:
        raise SelectionError(f"micro batch must be a positive integer, got {micro_batch}")
    m = int(sizes.min())
    m_adj = math.floor(m * ratio / 100)
    if drop_last:
        m_adj = (m_adj // int(micro_batch)) * int(micro_batch)
    if m_adj == 0:
        rounded = f", rounded down to a multiple of micro batch {micro_batch}" if drop_last else ""
        raise SelectionError(
            f"the balanced budget is 0 per cluster: the smallest cluster has m = {m} members, "
            f"ratio {ratio}% keeps floor({m} * {ratio} / 100) = {math.floor(m * ratio / 100)}"
            f"{rounded}; use a larger pool or ratio, fewer workers, or no rounding "
            "(selection.params.round_budget_to_batch: false)"
        )
    return m, m_adj


def explain_kept(sizes, ratio: float, m_adj: int, micro_batch: int = 1) -> str:
    """One line that says why CluSTER keeps what it keeps: K x m_adj of the pool, where m_adj comes
    from the smallest cluster (after the soft cap) and r; and, when that is under half of r, how
    to keep more."""
    sizes = np.asarray(sizes, dtype=np.int64)
    k, n, m = sizes.size, int(sizes.sum()), int(sizes.min())
    kept, r, floor_mr = k * int(m_adj), ratio / 100, math.floor(m * ratio / 100)
    line = (
        f"cluster: kept {kept}/{n} ({100 * kept / n:.1f}%) = K x m_adj = {k} x {m_adj}, "
        f"m_adj = smallest cluster ({m}) x r ({r:g}) rounded down = {floor_mr}"
    )
    if m_adj < floor_mr:
        line += f", then down to a multiple of the per-device batch ({micro_batch}) = {m_adj}"
    line += f" (cluster sizes after the soft cap: {', '.join(str(x) for x in sizes)})"
    if kept < r * n / 2:
        line += (
            f"; the smallest cluster is {m} of {n / k:.1f} on average, so this keeps under "
            "half of r: raise r (selection.params.ratio) or use a larger pool"
        )
    return line


def choose_within_cluster(
    X, centers, labels, m_adj: int | list[int], mode: str, seed: int
) -> dict[int, np.ndarray]:
    """Steps 5-6: {cluster k: the row indices kept}. Members are ranked by squared distance to
    their center, ascending (stable: ties by row index). "close" (the paper's default,
    "peripheral"): the m_adj farthest, farthest first; "far" ("core"): the m_adj nearest; "rand":
    uniform without replacement, seeded by (seed, k); "mix": floor(m_adj / 2) nearest, then the
    rest farthest; "big": the m_adj largest row L2 norms of X (the CALLER passes the un-normalized
    features for this mode; only K is read from centers); "none": all members in row order.
    m_adj: one count for every cluster (the paper's balanced budget), or a list of K counts, one
    per cluster, each 0..its size (clusters_per_worker > 1 shares a worker's budget among its
    clusters: method/packing.py)."""
    if mode not in PRUNE_MODES:
        raise SelectionError(f"unknown prune mode {mode!r}; choose one of {PRUNE_MODES}")
    X = _matrix(X)
    k = np.asarray(centers).shape[0]
    labels = _check_labels(labels, X.shape[0], k)
    members = [np.flatnonzero(labels == c) for c in range(k)]
    if mode == "none":
        return dict(enumerate(members))
    if np.ndim(m_adj) == 0:
        m_adj = int(m_adj)
        small = [c for c in range(k) if members[c].size < m_adj]
        if m_adj < 1 or small:
            raise SelectionError(
                f"cannot keep m_adj = {m_adj} per cluster: cluster(s) {small} "
                "are smaller (m_adj must be 1..smallest cluster size)"
            )
        counts = [m_adj] * k
    else:
        counts = [int(q) for q in m_adj]
        bad = [c for c in range(min(k, len(counts))) if not 0 <= counts[c] <= members[c].size]
        if len(counts) != k or bad:
            raise SelectionError(
                f"per-cluster kept counts {counts} do not fit the {k} clusters "
                f"of sizes {[int(m.size) for m in members]} (each must lie in "
                "0..its cluster's size)"
            )
    if mode == "big":
        norms = np.sqrt(_sq_norms(X))
        return {c: idx[np.argsort(-norms[idx], kind="stable")[: counts[c]]] for c, idx in enumerate(members)}
    if mode == "rand":
        return {
            c: np.random.default_rng([seed, c]).choice(idx, counts[c], replace=False)
            for c, idx in enumerate(members)
        }
    dist = sq_distances_to_own_center(X, centers, labels)
    out = {}
    for c, idx in enumerate(members):
        ranked = idx[np.argsort(dist[idx], kind="stable")]  # nearest first
        q = counts[c]
        half = q // 2
        out[c] = {
            "close": ranked[::-1][:q],
            "far": ranked[:q],
            "mix": np.concatenate([ranked[:half], ranked[::-1][: q - half]]),
        }[mode]
    return out


def authors_list_order(X, centers, labels, chosen: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """{cluster: the same kept rows, in the authors' list order} (method.md step 7): pool-index
    order, then stably sorted by squared distance to the cluster's center, ascending. For `close`
    this is the last m_adj of the cluster's ascending list, for `far` the first m_adj, as the
    authors keep them; the shuffle that follows (`method.allocation.authors_order`) depends on
    this order. X is the clustered (normalized) space, as for choose_within_cluster."""
    dist = sq_distances_to_own_center(X, centers, labels)
    out = {}
    for c, rows in chosen.items():
        rows = np.sort(np.asarray(rows, dtype=np.int64))
        out[c] = rows[np.argsort(dist[rows], kind="stable")]
    return out


def member_order(X, centers, labels, mode: str, seed: int) -> dict[int, np.ndarray]:
    """{cluster k: every member's row index, in the order `mode` keeps them}: for close, far, mix
    and big the first m of a cluster are the members choose_within_cluster keeps at m_adj = m
    (close: farthest first; far: nearest first; mix: farthest, nearest, next farthest, next
    nearest, ...; big: largest norm first, X un-normalized as there); rand: a permutation
    seeded by (seed, k) (a draw of the same law as choose_within_cluster's, not the same draw);
    none: row order. For budgets that differ between clusters (`token_budget`)."""
    if mode not in PRUNE_MODES:
        raise SelectionError(f"unknown prune mode {mode!r}; choose one of {PRUNE_MODES}")
    X = _matrix(X)
    k = np.asarray(centers).shape[0]
    labels = _check_labels(labels, X.shape[0], k)
    members = [np.flatnonzero(labels == c) for c in range(k)]
    if mode == "none":
        return dict(enumerate(members))
    if mode == "rand":
        return {c: np.random.default_rng([seed, c]).permutation(idx) for c, idx in enumerate(members)}
    if mode == "big":
        norms = np.sqrt(_sq_norms(X))
        return {c: idx[np.argsort(-norms[idx], kind="stable")] for c, idx in enumerate(members)}
    dist = sq_distances_to_own_center(X, centers, labels)
    out = {}
    for c, idx in enumerate(members):
        ranked = idx[np.argsort(dist[idx], kind="stable")]  # nearest first
        if mode == "far":
            out[c] = ranked
        elif mode == "close":
            out[c] = ranked[::-1]
        else:  # mix: at every m, floor(m / 2) nearest and the rest farthest
            far_first, near_first = ranked[::-1], ranked
            seq = [far_first[j // 2] if j % 2 == 0 else near_first[j // 2] for j in range(idx.size)]
            out[c] = np.asarray(seq, dtype=np.int64)
    return out


def token_budget(order: dict[int, np.ndarray], lengths, ratio: float) -> tuple[int, dict[int, np.ndarray]]:
    """Step 5 in tokens: (budget, {cluster: rows kept}). budget = floor(ratio / 100 x the smallest
    cluster's token total), the token analogue of m_adj; every cluster keeps the longest prefix of
    its `order` (member_order) whose tokens fit in it, so the kept token totals differ by less
    than one example's length. lengths[row]: the tokens of pool row `row`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not 0 < ratio <= 100:
        raise SelectionError(
            f"ratio = {ratio}: ratio is a percentage in 1..100, e.g. 50 for the paper's r = 0.5"
        )
    totals = {c: int(lengths[idx].sum()) for c, idx in order.items()}
    budget = math.floor(min(totals.values()) * ratio / 100)
    kept = {}
    for c, idx in order.items():
        n = int(np.searchsorted(np.cumsum(lengths[idx]), budget, side="right"))
        if n == 0:
            raise SelectionError(
                f"the token budget is {budget} tokens per cluster (ratio {ratio}% "
                f"of the smallest cluster's {min(totals.values())}); cluster {c}'s "
                f"first example alone has {int(lengths[idx[0]])}: use a larger "
                "ratio or pool, or budget_unit: examples"
            )
        kept[c] = idx[:n]
    return budget, kept


# -- steps 8, 9 and diagnostics --------------------------------------------------------------------
def rank_weights(sizes_after_cap, n_total: int) -> np.ndarray:
    """Step 8: w_k = K * n_k / N (float64), n_k = cluster k's size after the cap, before the budget
    trim. DDP averages worker gradients, so the update is sum_k (n_k / N) grad_k."""
    sizes = np.asarray(sizes_after_cap, dtype=np.float64)
    if sizes.size == 0 or n_total <= 0 or sizes.sum() != n_total:
        raise SelectionError(
            f"rank weights need cluster sizes summing to N = {n_total}, got {sizes.astype(np.int64).tolist()}"
        )
    return sizes.size * sizes / n_total


def uniform_upsample(labels, k: int, seed: int) -> dict[int, np.ndarray]:
    """Step 9: {cluster: rows}: every cluster's members (row order), then extra members drawn with
    replacement (seeded by (seed, cluster)) up to the largest cluster's size. Weights are 1."""
    labels = _check_labels(labels, np.shape(labels)[0], k)
    sizes = np.bincount(labels, minlength=k)
    if sizes.min() == 0:
        raise SelectionError(
            f"cluster(s) {np.flatnonzero(sizes == 0).tolist()} are empty: nothing to up-sample"
        )
    top = int(sizes.max())
    out = {}
    for c in range(k):
        idx = np.flatnonzero(labels == c)
        extra = np.random.default_rng([seed, c]).choice(idx, top - idx.size, replace=True)
        out[c] = np.concatenate([idx, extra])
    return out


def cluster_agreement(labels, categories) -> dict:
    """How well clusters match the pool's task categories (rows with category None left out):
    {"nmi", "ari", "purity" (share of rows in their cluster's majority category), "n"}.
    categories None -> {}."""
    if categories is None:
        return {}
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
    from sklearn.metrics.cluster import contingency_matrix

    labels = np.asarray(labels)
    if len(categories) != labels.shape[0]:
        raise SelectionError(f"{len(categories)} categories for {labels.shape[0]} labels")
    keep = [i for i, c in enumerate(categories) if c is not None]
    if not keep:
        return {}
    _, cats = np.unique(np.array([str(categories[i]) for i in keep]), return_inverse=True)
    lab = labels[keep]
    table = contingency_matrix(lab, cats)  # clusters x categories
    return {
        "nmi": float(normalized_mutual_info_score(cats, lab)),
        "ari": float(adjusted_rand_score(cats, lab)),
        "purity": float(table.max(axis=1).sum() / len(keep)),
        "n": len(keep),
    }
