"""CluSTER step 2 and the row arithmetic every later step shares (docs/method.md): the input
checks (finite rows, K, labels), squared row norms, squared distances to centers, the
normalization of the gradient features (in memory, into a memmap, or lazily block by block:
NormalizedRows) and the seeded random projection. method/kmeans.py (step 3) and
method/clustering.py (steps 4-9) build on it.

Conventions: X is N x D (float32; converted when not), indices are row indices into X, K is the
number of clusters (= world size). Squared Euclidean distances are in squared feature units
(float64 results from float32 products; see pairwise_sq_distances).
"""

from __future__ import annotations

import numpy as np

from repro.core.interfaces import SelectionError

NORM_MODES = ("auto", "l2", "center", "none")
ROW_CHUNK = 65536  # rows per block where a step reads a (memmapped) matrix in blocks


# -- checks and row arithmetic --------------------------------------------------------------------
class NormalizedRows:
    """Step 2 without a second matrix: the rows of `normalize_features(X, k, mode)`, computed
    block by block when read (X: N x D float32, typically a memmap of features.npy). Holds X, the
    row norms (l2) or the mean row (center): O(N) memory, never an N x D copy. Rows read from it
    equal normalize_features' rows bit for bit (the same per-row operations). Every step of this
    module takes one where it takes a matrix, and reads it in ROW_CHUNK-row blocks; the exact
    (scikit-learn) and faiss modes need the matrix in memory and refuse it."""

    def __init__(self, X, k: int, mode: str = "auto", chunk: int | None = None) -> None:
        if mode not in NORM_MODES:
            raise SelectionError(f"unknown normalization {mode!r}; choose one of {NORM_MODES}")
        if int(k) != k or k < 1:
            raise SelectionError(f"K = world size = {k} must be a positive integer")
        X = np.asarray(X)
        if X.ndim != 2 or X.dtype not in (np.float32, np.float16):
            raise SelectionError(
                f"features must be a 2-D float32 or float16 array (N x D), got {X.dtype} {X.shape}"
            )
        self.X, self.shape, self.dtype = X, X.shape, np.dtype(np.float32)
        self.chunk = chunk or ROW_CHUNK
        self.mode = ("l2" if k > 1 else "center") if mode == "auto" else mode
        self.norms = self.mean = None
        sq = []
        for a in range(0, X.shape[0], self.chunk):  # one pass: the finite check and the row norms
            xb = np.asarray(X[a : a + self.chunk], dtype=np.float32)
            try:
                _check_finite(xb)
            except SelectionError as e:
                raise SelectionError(f"{e} (in rows {a}..{a + len(xb) - 1} of {X.shape[0]})") from None
            if self.mode == "l2":
                sq.append(_sq_norms(xb))
        if self.mode == "l2":
            self.norms = np.sqrt(np.concatenate(sq) if sq else np.empty(0))
            zero = np.flatnonzero(self.norms == 0)
            if zero.size:
                raise SelectionError(
                    f"{zero.size} feature row(s) are all zeros (first: row "
                    f"{int(zero[0])}); they cannot be L2-normalized (empty response?)"
                )
            self.norms32 = self.norms.astype(np.float32)
            self.odd = ~((self.norms > 1e-30) & (self.norms < 1e30))
        elif self.mode == "center":
            total = np.zeros(X.shape[1], dtype=np.float64)
            if X.dtype == np.float32:  # the in-memory form's own reduction: the same mean
                total = X.mean(axis=0, dtype=np.float64)
            else:
                for a in range(0, X.shape[0], self.chunk):
                    total += np.asarray(X[a : a + self.chunk], dtype=np.float64).sum(axis=0)
                total /= max(1, X.shape[0])
            self.mean = total.astype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        """Rows `key` (a slice or an index array; int: one row), normalized, as a new array."""
        if isinstance(key, (int, np.integer)):
            return self[np.array([key])][0]
        xb = np.asarray(self.X[key], dtype=np.float32)
        if self.mode == "center":
            return xb - self.mean
        if self.mode == "none":
            return xb.copy()
        nb, nb32, odd = self.norms[key], self.norms32[key], self.odd[key]
        with np.errstate(all="ignore"):
            out = xb / nb32[:, None]
        if odd.any():
            out[odd] = (xb[odd] / nb[odd, None]).astype(np.float32)
        return out

    def blocks(self):
        """(start, block) over all rows, chunk rows at a time."""
        for a in range(0, self.shape[0], self.chunk):
            yield a, self[a : a + self.chunk]


def _lazy(X) -> bool:
    return isinstance(X, NormalizedRows)


def _matrix(X) -> np.ndarray:
    if _lazy(X):
        return X  # read in blocks by every caller
    X = np.asarray(X)
    if X.ndim != 2:
        raise SelectionError(f"features must be a 2-D array (N x D), got shape {X.shape}")
    return np.ascontiguousarray(X, dtype=np.float32)


def _check_finite(X: np.ndarray) -> None:
    """SelectionError naming the bad rows if any entry is NaN or +-inf. One random projection, not
    an N x D mask (1.2 GB at 75k x 4096): NaN/inf always makes the row's projection non-finite;
    flagged rows are checked exactly (a finite row whose projection overflows is cleared)."""
    if _lazy(X):  # its rows were checked when it was made (and normalizing keeps them finite)
        return
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
    if _lazy(X):
        return np.concatenate([_sq_norms(b) for _, b in X.blocks()] or [np.empty(0)])
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
    if _lazy(X):  # enough distinct values in a block of rows settles it without a full pass
        head = X[0 : min(X.shape[0], 65536)]
        if any(np.unique(head[:, j]).size >= k for j in range(min(X.shape[1], 8))):
            return k
    for j in range(min(X.shape[1], 8)):
        col = np.concatenate([b[:, j] for _, b in X.blocks()]) if _lazy(X) else X[:, j]
        if np.unique(col).size >= k:
            return k
    if _lazy(X):
        raise SelectionError(
            f"fewer than K = {k} distinct values in each of the first 8 feature columns of a "
            f"{X.shape[0]} x {X.shape[1]} matrix; the features look degenerate"
        )
    return int(np.unique(X, axis=0).shape[0])


def pairwise_sq_distances(X, centers) -> np.ndarray:
    """[N, K] squared distances (float64, squared feature units) from every row to every center, as
    |x|^2 + |c|^2 - 2 x.c with the products in float32 (float64 when they could overflow). The soft
    cap and its reference both use it, so both see identical numbers (ties included)."""
    if _lazy(X):  # block by block: N x K out, one block of rows in memory
        return np.concatenate(
            [pairwise_sq_distances(b, centers) for _, b in X.blocks()] or [np.empty((0, len(centers)))]
        )
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
def normalize_features(X, k: int, mode: str = "auto", out=None, chunk: int = ROW_CHUNK) -> np.ndarray:
    """Step 2. "auto": K > 1 -> L2-normalize each row (unit norm); K == 1 -> subtract the mean row.
    Also "l2", "center", "none" (a float32 copy). Returns a new float32 N x D array.

    `out`: an N x D float32 array to write into instead (e.g. a memmap on disk, for a matrix
    that does not fit in memory twice); then X (a memmap too) is read in `chunk`-row blocks, and
    memory holds one block, never a copy of X. The rows are the same bit for bit either way
    (every step is per row; center's mean is the same reduction)."""
    if mode not in NORM_MODES:
        raise SelectionError(f"unknown normalization {mode!r}; choose one of {NORM_MODES}")
    if int(k) != k or k < 1:
        raise SelectionError(f"K = world size = {k} must be a positive integer")
    if out is not None:
        return _normalize_into(X, k, mode, out, chunk)
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


def _normalize_into(X, k: int, mode: str, out, chunk: int) -> np.ndarray:
    """normalize_features into `out`, `chunk` rows at a time (the rows of the in-memory form)."""
    X = np.asarray(X)
    if X.ndim != 2 or np.shape(out) != X.shape:
        raise SelectionError(f"normalize: out has shape {np.shape(out)}, features {X.shape}")
    mode = ("l2" if k > 1 else "center") if mode == "auto" else mode
    mean = None
    if mode == "center":
        mean = X.mean(axis=0, dtype=np.float64).astype(np.float32)
    for a in range(0, X.shape[0], chunk):
        xb = np.ascontiguousarray(X[a : a + chunk], dtype=np.float32)
        try:
            if mode == "center":
                _check_finite(xb)
                out[a : a + chunk] = xb - mean
            else:
                out[a : a + chunk] = normalize_features(xb, k, mode)
        except SelectionError as e:  # row indices of the block: say where they are in X
            raise SelectionError(f"{e} (in rows {a}..{a + len(xb) - 1} of {X.shape[0]})") from None
    return out


def project_features(X, dim: int, seed: int, out=None, chunk: int = ROW_CHUNK) -> np.ndarray:
    """A seeded Gaussian random projection (Johnson-Lindenstrauss) of the rows of X to `dim`
    columns, entries N(0, 1/dim), in `chunk`-row blocks (into `out` when given, e.g. a memmap).
    Squared distances are kept up to a factor 1 +- eps with eps ~ sqrt(8 ln N / dim)."""
    X = X if _lazy(X) else np.asarray(X)
    n, d = X.shape
    if not 1 <= dim:
        raise SelectionError(f"projection dimension {dim} must be >= 1")
    proj = np.random.default_rng([seed, 11]).standard_normal((d, dim)).astype(np.float32) / np.float32(
        np.sqrt(dim)
    )
    out = np.empty((n, dim), dtype=np.float32) if out is None else out
    for a in range(0, n, chunk):
        out[a : a + chunk] = np.ascontiguousarray(X[a : a + chunk], dtype=np.float32) @ proj
    return out
