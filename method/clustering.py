"""CluSTER steps 4-9 (see docs/method.md): the soft capacity cap, the balanced budget (in
examples or tokens), the choice inside each cluster, the authors' list order, the rank weights,
the uniform (up-sampling) variant and the clusters' agreement with the pool's categories.

Steps 2 and 3 (normalization, k-means) are method/rows.py and method/kmeans.py.

Conventions: X is N x D (float32; converted when not), indices are row indices into X, K is the
number of clusters (= world size). Squared Euclidean distances are in squared feature units
(float64 results from float32 products; see method.rows.pairwise_sq_distances).
"""

from __future__ import annotations

import math

import numpy as np

from method.rows import (
    _check_labels,
    _matrix,
    _sq_norms,
    pairwise_sq_distances,
    sq_distances_to_own_center,
)
from repro.core.interfaces import SelectionError

__all__ = [
    "PRUNE_MODES",
    "authors_list_order",
    "balanced_budget",
    "choose_within_cluster",
    "cluster_agreement",
    "explain_kept",
    "member_order",
    "rank_weights",
    "soft_cap_assign",
    "token_budget",
    "uniform_upsample",
]

PRUNE_MODES = ("close", "far", "rand", "mix", "big", "none")


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
    del d
    pair_ctrs = cand.ravel()[flat]
    flat //= nc  # the pairs' rows, in place (N x nc int64: the cap's O(N K) pairs)
    out = [-1] * n  # N pointers to cached small ints: 8 bytes a row
    room = [cap] * k
    left = n
    # the greedy pass (the one sequential part), over the pairs in blocks: Python objects for
    # one block at a time, never for all N x nc pairs
    for a in range(0, flat.size, 1 << 20):
        rows_b, ctrs_b = flat[a : a + (1 << 20)].tolist(), pair_ctrs[a : a + (1 << 20)].tolist()
        for i, c in zip(rows_b, ctrs_b):
            if out[i] < 0 and room[c] > 0:
                out[i] = c
                room[c] -= 1
                left -= 1
                if left == 0:
                    break
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


def _members(X, centers, labels, mode: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(X as a matrix, labels, members): the prune mode, X and labels checked; members[c] is cluster c's
    row indices in row order. What choose_within_cluster and member_order start from."""
    if mode not in PRUNE_MODES:
        raise SelectionError(f"unknown prune mode {mode!r}; choose one of {PRUNE_MODES}")
    X = _matrix(X)
    k = np.asarray(centers).shape[0]
    labels = _check_labels(labels, X.shape[0], k)
    return X, labels, [np.flatnonzero(labels == c) for c in range(k)]


def _ranked(X, centers, labels, members: list[np.ndarray], mode: str) -> list[np.ndarray]:
    """Every cluster's members ranked, stably (ties by row index): "big": largest row L2 norm of X
    first; any other mode: by squared distance to their center, nearest first."""
    if mode == "big":
        norms = np.sqrt(_sq_norms(X))
        return [idx[np.argsort(-norms[idx], kind="stable")] for idx in members]
    dist = sq_distances_to_own_center(X, centers, labels)
    return [idx[np.argsort(dist[idx], kind="stable")] for idx in members]


def _kept_counts(m_adj: int | list[int], members: list[np.ndarray]) -> list[int]:
    """The rows each cluster keeps: m_adj for every one (1..the smallest size), or a list of K
    counts, each 0..its cluster's size; SelectionError otherwise."""
    k = len(members)
    if np.ndim(m_adj) == 0:
        m_adj = int(m_adj)
        small = [c for c in range(k) if members[c].size < m_adj]
        if m_adj < 1 or small:
            raise SelectionError(
                f"cannot keep m_adj = {m_adj} per cluster: cluster(s) {small} "
                "are smaller (m_adj must be 1..smallest cluster size)"
            )
        return [m_adj] * k
    counts = [int(q) for q in m_adj]
    bad = [c for c in range(min(k, len(counts))) if not 0 <= counts[c] <= members[c].size]
    if len(counts) != k or bad:
        raise SelectionError(
            f"per-cluster kept counts {counts} do not fit the {k} clusters "
            f"of sizes {[int(m.size) for m in members]} (each must lie in "
            "0..its cluster's size)"
        )
    return counts


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
    X, labels, members = _members(X, centers, labels, mode)
    if mode == "none":
        return dict(enumerate(members))
    counts = _kept_counts(m_adj, members)
    if mode == "rand":
        return {
            c: np.random.default_rng([seed, c]).choice(idx, counts[c], replace=False)
            for c, idx in enumerate(members)
        }
    out = {}
    for c, ranked in enumerate(_ranked(X, centers, labels, members, mode)):
        q = counts[c]
        half = q // 2
        if mode in ("big", "far"):  # largest norm / nearest first
            out[c] = ranked[:q]
        elif mode == "close":
            out[c] = ranked[::-1][:q]
        else:  # mix
            out[c] = np.concatenate([ranked[:half], ranked[::-1][: q - half]])
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
    X, labels, members = _members(X, centers, labels, mode)
    if mode == "none":
        return dict(enumerate(members))
    if mode == "rand":
        return {c: np.random.default_rng([seed, c]).permutation(idx) for c, idx in enumerate(members)}
    out = {}
    for c, ranked in enumerate(_ranked(X, centers, labels, members, mode)):
        if mode in ("big", "far"):  # largest norm / nearest first
            out[c] = ranked
        elif mode == "close":
            out[c] = ranked[::-1]
        else:  # mix: at every m, floor(m / 2) nearest and the rest farthest
            far_first, near_first = ranked[::-1], ranked
            seq = [far_first[j // 2] if j % 2 == 0 else near_first[j // 2] for j in range(ranked.size)]
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


# The chance correction of purity (docs/claims.md, C6): random partitions of the pool into
# clusters of the same sizes, drawn PURITY_PERMS times (fewer for a large pool, at least 199:
# about PERM_CELLS row draws in all), and the share of them at least as pure as the clusters.
PURITY_PERMS = 999
PURITY_PERMS_MIN = 199
PERM_CELLS = 200_000_000


def cluster_agreement(labels, categories, seed: int = 0) -> dict:
    """How well clusters match the pool's task categories (rows with category None left out):
    {"nmi", "ari", "purity" (share of rows in their cluster's majority category), "n"}, and
    purity against chance: "purity_chance_mean" and "purity_chance_q95" (its mean and 95th
    percentile over random partitions of the same rows into clusters of the same sizes, seeded),
    "purity_p" (the permutation p-value: (1 + partitions at least as pure) / (1 + partitions)),
    "purity_perms" (how many) and "purity_max" (the most any partition into this many clusters
    can reach: the share of the largest categories, one per cluster).
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
    purity = float(table.max(axis=1).sum() / len(keep))
    n_perm = int(min(PURITY_PERMS, max(PURITY_PERMS_MIN, PERM_CELLS // len(keep))))
    chance = _chance_purity(lab, cats, n_perm, seed)
    n_clusters, n_cats = table.shape
    top = np.sort(np.bincount(cats))[::-1][:n_clusters]
    return {
        "nmi": float(normalized_mutual_info_score(cats, lab)),
        "ari": float(adjusted_rand_score(cats, lab)),
        "purity": purity,
        "purity_chance_mean": float(chance.mean()),
        "purity_chance_q95": float(np.quantile(chance, 0.95)),
        "purity_p": float((1 + np.sum(chance >= purity - 1e-12)) / (1 + n_perm)),
        "purity_perms": n_perm,
        "purity_max": float(min(1.0, top.sum() / len(keep))),
        "n": len(keep),
    }


def _chance_purity(labels: np.ndarray, cats: np.ndarray, n_perm: int, seed: int) -> np.ndarray:
    """Purity of n_perm random partitions with the clusters' sizes: the categories shuffled over
    the rows (seeded by `seed`), each cluster keeping its rows' positions."""
    _, lab = np.unique(labels, return_inverse=True)
    k, c = int(lab.max()) + 1, int(cats.max()) + 1
    rng = np.random.default_rng([seed, 6])  # 6: the paper's C6, a stream of its own
    out = np.empty(n_perm)
    for i in range(n_perm):
        counts = np.bincount(lab * c + rng.permutation(cats), minlength=k * c).reshape(k, c)
        out[i] = counts.max(axis=1).sum()
    return out / lab.size
