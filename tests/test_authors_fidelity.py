"""CluSTER with the authors' switches equals a reference written from method.md, order included.

`reference` below is method.md steps 2-8 and "The authors' exact order" written out directly in
numpy and Python's `random` (only k-means is sklearn's, as in the authors' code), independently of
method/: L2 normalization, KMeans(k-means++, n_init 10, max_iter 300, random_state seed), the soft
cap as a plain loop over sorted (point, candidate) pairs, the balanced budget without rounding,
`close`/`far` from each cluster's ascending distance list, the rank weights, the per-cluster
`random.Random(seed + c)` shuffle, the interleave by label and the per-epoch reshuffle of each
residue mod K with `random.Random(seed + e + 12345 + r)`. The suite runs as a user runs it:
`cluster` with `order: authors` and `round_budget_to_batch: false` on the same features, then
`cluster-interleave`, which follows the selection's order.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from sklearn.cluster import KMeans

from repro.core.config.builder import ConfigError
from repro.core.config.load import from_dict
from repro.core.interfaces import AllocationContext, SelectionContext, SelectionError
from repro.core.registry import ALLOCATORS, SELECTORS
from repro.core.types import Example, Pool, Selection
from tests.feature_helpers import plant_features

EPOCHS = 2
BATCH = 2  # per-device batch: the suite's old default would round m_adj to an even number


@pytest.fixture(autouse=True)
def one_blas_thread():
    """scikit-learn's k-means on one thread: tiny problems gain nothing from threads, and OpenMP's
    spin-waiting on a busy machine made them many times slower."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


def skewed_features(n: int, k: int, seed: int) -> np.ndarray:
    """n rows around k blob centres whose shares grow geometrically (x1.25 per blob), so the
    largest blob is many times the smallest and k-means' largest cluster usually exceeds the
    soft cap (1.5 N / K)."""
    rng = np.random.default_rng(seed)
    share = 1.25 ** np.arange(k)
    sizes = np.maximum(3, np.floor(n * share / share.sum()).astype(int))
    centres = 3.0 * rng.standard_normal((k, 24))
    X = np.concatenate([c + rng.standard_normal((s, 24)) for c, s in zip(centres, sizes)])
    return X[rng.permutation(len(X))].astype(np.float32)


def reference(X: np.ndarray, k: int, seed: int, ratio: float, prune: str, epochs: int):
    """(labels after the cap, kept list per cluster, weights, order[epoch][worker]), in rows."""
    n = len(X)
    if k == 1:  # one worker: every example, pool order, no shuffle
        rows = list(range(n))
        return [0] * n, {0: rows}, [1.0], [[rows] for _ in range(epochs)]
    Xn = X / np.linalg.norm(X.astype(np.float64), axis=1, keepdims=True).astype(np.float32)
    km = KMeans(n_clusters=k, init="k-means++", n_init=10, max_iter=300, random_state=seed).fit(Xn)
    C = km.cluster_centers_.astype(np.float64)
    d = ((Xn.astype(np.float64)[:, None, :] - C[None]) ** 2).sum(-1)
    labels = km.labels_.tolist()
    if max(np.bincount(labels, minlength=k)) > 1.5 * n / k:  # the soft cap
        cap = math.ceil(1.5 * n / k)
        nearest = [sorted(range(k), key=lambda c: (d[i, c], c)) for i in range(n)]
        pairs = [(d[i, c], i, c) for i in range(n) for c in nearest[i][:8]]
        pairs.sort(key=lambda p: p[0])  # stable: ties keep (point, candidate rank) order
        labels, room = [-1] * n, [cap] * k
        for _, i, c in pairs:
            if labels[i] < 0 and room[c] > 0:
                labels[i], room[c] = c, room[c] - 1
        for i in range(n):
            if labels[i] < 0:
                free = [c for c in nearest[i] if room[c] > 0]
                labels[i] = free[0] if free else nearest[i][0]
                if free:
                    room[labels[i]] -= 1
    sizes = [labels.count(c) for c in range(k)]
    m_adj = math.floor(min(sizes) * ratio / 100)  # the authors' loader keeps incomplete batches
    kept = {}
    for c in range(k):
        members = [i for i in range(n) if labels[i] == c]  # pool-index order
        members.sort(key=lambda i: d[i, c])  # stable, ascending distance
        kept[c] = members[-m_adj:] if prune == "close" else members[:m_adj]
    weights = [k * s / n for s in sizes]
    order = [[out[w::k] for w in range(k)] for out in epoch_orders(kept, k, seed, epochs)]
    return labels, kept, weights, order


def epoch_orders(kept: dict[int, list[int]], k: int, seed: int, epochs: int) -> list[list[int]]:
    """Each epoch's whole order (method.md step 7): kept list c shuffled with random.Random(seed
    + c), interleaved by label, then the positions of residue r mod K shuffled with
    random.Random(seed + e + 12345 + r)."""
    lists = []
    for c in range(k):
        lst = list(kept[c])
        random.Random(seed + c).shuffle(lst)
        lists.append(lst)
    flat = [lists[c][j] for j in range(len(lists[0])) for c in range(k)]
    out_epochs = []
    for e in range(epochs):
        out = list(flat)
        for r in range(k):
            vals = out[r::k]
            random.Random(seed + e + 12345 + r).shuffle(vals)
            out[r::k] = vals
        out_epochs.append(out)
    return out_epochs


def dealt_in_batches(order: list[int], k: int, b: int) -> list[list[int]]:
    """method.md "Per-device batch B > 1": global batch j, the positions jB .. jB+B-1 of the
    epoch's order, goes to worker j mod K. The last round of K batches, if incomplete, is
    completed from the epoch's first positions onwards (docs/method.md: the authors' loader,
    accelerate's even batches)."""
    rounds = -(-len(order) // (k * b))
    workers: list[list[int]] = [[] for _ in range(k)]
    for position in range(rounds * k * b):
        workers[(position // b) % k].append(order[position % len(order)])
    return workers


def _pool(n: int) -> Pool:
    return Pool([Example(id=f"x{i:04d}", prompt=f"p{i}", response=f"r{i}", source="t") for i in range(n)])


def _ctx(tmp_path: Path, X: np.ndarray, k: int, seed: int, drop_last: bool = True, batch: int = BATCH):
    plant_features(tmp_path, X, _pool(len(X)))
    cfg = from_dict(
        {},
        [
            f"world_size={k}",
            f"train.per_device_batch_size={batch}",
            f"train.global_batch_size={batch * k}",
            f"train.drop_last={drop_last}",
        ],
    )
    return SelectionContext(config=cfg, seed=seed, world_size=k, workdir=tmp_path)


def _run_suite(pool: Pool, ctx: SelectionContext, params: dict, per_device_batch: int = 1):
    """The selection, and the schedule the pipeline deals at `per_device_batch`."""
    sel = SELECTORS.create("cluster", params, "selection.params").select(pool, None, ctx)
    step = AllocationContext({}, per_device_batch=per_device_batch, grad_accum=1)
    sched = ALLOCATORS.create("cluster-interleave", {}, "allocation.params").allocate(
        sel, ctx.world_size, ctx.seed, epochs=EPOCHS, weight_mode="rank", ctx=step
    )
    return sel, sched


@pytest.mark.parametrize("k,prune,seed", [(4, "close", 42), (8, "far", 7), (16, "close", 42)])
def test_the_suite_replays_the_authors_selection_and_training_order(
    tmp_path: Path, k: int, prune: str, seed: int
) -> None:
    X = skewed_features(30 * k, k, seed)
    pool = _pool(len(X))
    sel, sched = _run_suite(
        pool,
        _ctx(tmp_path, X, k, seed),
        {"ratio": 50, "prune": prune, "order": "authors", "round_budget_to_batch": False},
    )
    labels, kept, weights, order = reference(X, k, seed, 50, prune, EPOCHS)
    ids = pool.ids

    capped = max(np.bincount(labels)) < max(sel.diagnostics.cluster_sizes_before_cap)
    assert sel.diagnostics.cluster_sizes_after_cap == [labels.count(c) for c in range(k)]
    if k >= 8:
        assert capped  # the skew is strong enough for the soft cap to act
    # Kept sets, per cluster, in the authors' list order (the shuffle depends on it).
    for c in range(k):
        got = [i for i, cc in zip(sel.ids, sel.clusters) if cc == c]
        assert got == [ids[r] for r in kept[c]]
    assert sel.info["m_adj"] == len(kept[0])  # not rounded to the per-device batch
    # Workers, weights and every epoch's order on every worker.
    assert sched.info["order"] == "authors"
    assert sched.worker_weights == pytest.approx(weights, rel=1e-12)
    for e in range(EPOCHS):
        for w in range(k):
            assert sched.order[e][w] == [ids[r] for r in order[e][w]]
            assert {sched.clusters[i] for i in sched.order[e][w]} == {w}
    assert sched.order[0] != sched.order[1]  # epoch e reshuffles


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_the_authors_loader_deals_batch_j_to_worker_j_mod_k_at_any_batch(tmp_path: Path, batch: int) -> None:
    """Per-device batch B = 1, 2, 4 at K = 4: every worker's epoch-0 and epoch-1 order equals
    the reference's deal of the authors' order in batches (method.md "Per-device batch B > 1"),
    the worker weights stay w_k, and the clusters on each worker are method.md's: at B = 2
    workers 0 and 2 train clusters {0, 1}, 1 and 3 {2, 3}; at B = 4 every worker trains all."""
    k, seed = 4, 42
    X = skewed_features(30 * k + 3, k, seed)
    pool = _pool(len(X))
    params = {"ratio": 55, "prune": "close", "order": "authors", "round_budget_to_batch": False}
    sel, sched = _run_suite(pool, _ctx(tmp_path, X, k, seed, batch=batch), params, per_device_batch=batch)
    labels, kept, weights, _ = reference(X, k, seed, 55, "close", EPOCHS)
    ids = pool.ids
    m_adj = len(kept[0])
    assert batch == 1 or m_adj % batch, "the tail must not divide evenly: the wrap is part of the test"
    for e, order in enumerate(epoch_orders(kept, k, seed, EPOCHS)):
        for w, rows in enumerate(dealt_in_batches(order, k, batch)):
            assert sched.order[e][w] == [ids[r] for r in rows], (e, w)
    assert sched.order[0] != sched.order[1]
    assert sched.info["padded"] == -(-k * m_adj // (k * batch)) * k * batch - k * m_adj
    assert sched.worker_weights == pytest.approx(weights, rel=1e-12)
    assert sched.example_weights == {}  # w_k multiplies worker k's loss, whatever it trains
    expected = {1: [{0}, {1}, {2}, {3}], 2: [{0, 1}, {2, 3}, {0, 1}, {2, 3}], 4: [set(range(k))] * k}[batch]
    for e in range(EPOCHS):
        assert [{sched.clusters[i] for i in ids_w} for ids_w in sched.order[e]] == expected


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_the_authors_deal_equals_accelerates_batch_sharding(batch: int) -> None:
    """The deal, tail included, is what accelerate (the authors' loader's sharding) gives each
    process for the same epoch order: `BatchSamplerShard` with even batches over the order in
    batches of B, on unequal clusters so that the last round is incomplete."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    from method.allocation import authors_order

    k, seed = 4, 3
    groups = [[f"c{c}-{j}" for j in range(5 + c)] for c in range(k)]  # 26 ids
    order, padded = authors_order(groups, seed, 2, batch)
    plain, _ = authors_order(groups, seed, 2, 1)
    for e in range(2):
        # The epoch's order is the B = 1 deal read back position by position (its tail included).
        width = max(len(w) for w in plain[e])
        flat = [plain[e][p % k][p // k] for p in range(width * k)][:26]
        batches = BatchSampler(flat, batch, drop_last=False)
        for w in range(k):
            shard = BatchSamplerShard(batches, k, w, split_batches=False, even_batches=True)
            assert order[e][w] == [i for b in shard for i in b]
    assert padded == -(-26 // (k * batch)) * k * batch - 26


def test_one_worker_the_authors_way_keeps_every_example_in_pool_order(tmp_path: Path) -> None:
    X = skewed_features(40, 4, 0)
    pool = _pool(len(X))
    sel, sched = _run_suite(pool, _ctx(tmp_path, X, 1, 42), {"ratio": 50, "order": "authors"})
    _, kept, weights, order = reference(X, 1, 42, 50, "close", EPOCHS)
    assert sel.ids == [pool.ids[r] for r in kept[0]] == pool.ids
    assert sched.worker_weights == weights
    assert (
        sched.order
        == [[pool.ids] for _ in range(EPOCHS)]
        == [[[pool.ids[r] for r in order[e][0]]] for e in range(EPOCHS)]
    )
    # The suite's own K = 1 keeps floor(N * ratio / 100), rounded to the batch by default.
    suite, _ = _run_suite(pool, _ctx(tmp_path, X, 1, 42), {"ratio": 50})
    assert len(suite.ids) == (len(X) // 2) // BATCH * BATCH < len(X)


def test_budget_rounding_is_its_own_switch(tmp_path: Path) -> None:
    """Planted clusters of 10 and 14 at ratio 90: m_adj = 9, rounded to 8 at per-device batch 2
    only when asked (null follows train.drop_last, the suite's behaviour before the switch)."""
    r = np.random.default_rng(0)
    X = np.zeros((24, 8), dtype=np.float32)
    X[:10, 0], X[10:, 1] = 5.0, 5.0
    X += 0.1 * r.standard_normal(X.shape).astype(np.float32)
    pool = _pool(24)

    def m_adj(drop_last: bool, **params) -> int:
        sel = SELECTORS.create("cluster", {"ratio": 90, "n_init": 2, **params}, "k").select(
            pool, None, _ctx(tmp_path, X, 2, 0, drop_last)
        )
        return sel.info["m_adj"]

    assert m_adj(True) == 8 and m_adj(False) == 9
    assert m_adj(True, round_budget_to_batch=False) == 9
    assert m_adj(False, round_budget_to_batch=True) == 8
    with pytest.raises(ConfigError, match="round_budget_to_batch"):
        SELECTORS.create("cluster", {"round_budget_to_batch": "yes"}, "k")


def test_the_allocators_order_follows_the_selection_and_refuses_a_contradiction() -> None:
    ids = [f"c{c}-{j}" for c in range(2) for j in range(3)]
    plain = Selection(ids=ids, clusters=[0, 0, 0, 1, 1, 1])  # e.g. S2L: no stated order
    authors = ALLOCATORS.create("cluster-interleave", {"order": "authors"}, "k")
    # An explicit order on a selection that states none: the authors' streams.
    got = authors.allocate(plain, 2, 5, epochs=1).order[0]
    lists = [ids[:3], ids[3:]]
    for c in range(2):
        random.Random(5 + c).shuffle(lists[c])
    for r in range(2):
        random.Random(5 + 0 + 12345 + r).shuffle(lists[r])
    assert got == lists
    stated = Selection(ids=ids, clusters=plain.clusters, info={"order": "suite"})
    with pytest.raises(SelectionError, match="selection.params.order: suite"):
        authors.allocate(stated, 2, 5)
    with pytest.raises(ConfigError, match="allocation.params.order"):
        ALLOCATORS.create("cluster-interleave", {"order": "theirs"}, "allocation.params")


def test_the_paper_grids_run_cluster_the_authors_way() -> None:
    """Both paper grids' `cluster` entry, applied to the paper recipe as a grid cell is."""
    import yaml

    from repro.core.config.load import load_config
    from tests.conftest import CONFIGS

    for name in ("paper.yaml", "paper-baselines.yaml"):
        grid = yaml.safe_load((CONFIGS / "experiments" / name).read_text())["grid"]
        overrides = grid["methods"]["cluster"]["overrides"]
        cfg = load_config(CONFIGS / "paper" / "recipe.yaml", overrides)
        params = cfg.selection.params
        assert params["order"] == "authors" and params["round_budget_to_batch"] is False
        SELECTORS.create("cluster", params, "selection.params")  # the selector accepts them


def test_a_failed_selection_stops_its_memory_tracing(tmp_path: Path) -> None:
    """K larger than the pool fails inside the traced part of `cluster`; tracing must stop, or
    every later allocation of the process (the rest of a test session) runs traced, many times
    slower."""
    import tracemalloc

    X = skewed_features(10, 2, 0)
    with pytest.raises(SelectionError, match="larger than the pool"):
        SELECTORS.create("cluster", {}, "k").select(_pool(len(X)), None, _ctx(tmp_path, X, 64, 0))
    assert not tracemalloc.is_tracing()
