"""cluster-interleave (method.md step 7) and rank weights (step 8), as properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.core.interfaces import SelectionError
from repro.core.registry import ALLOCATORS
from repro.core.types import Selection


def _balanced(k: int, m: int) -> Selection:
    ids = [f"c{c}-{j}" for c in range(k) for j in range(m)]
    clusters = [c for c in range(k) for _ in range(m)]
    return Selection(ids=ids, clusters=clusters, group_weights={c: 0.5 + c for c in range(k)})


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 8),
    m=st.integers(1, 12),
    batch=st.integers(1, 4),
    accum=st.integers(1, 3),
    epochs=st.integers(1, 3),
    seed=st.integers(0, 10_000),
)
def test_each_worker_gets_only_its_cluster_and_every_step_covers_every_cluster(
    k: int, m: int, batch: int, accum: int, epochs: int, seed: int
) -> None:
    sel = _balanced(k, m)
    sched = ALLOCATORS.create("cluster-interleave", {}, "k").allocate(sel, k, seed, epochs, "rank")
    assert sched.world_size == k and sched.epochs == epochs
    for e in range(epochs):
        for w in range(k):
            ids = sched.order[e][w]
            assert len(ids) == m
            assert {sched.clusters[i] for i in ids} == {w}  # cluster w trains on worker w
            assert sorted(ids) == sorted(sched.order[0][w])  # reshuffled within the worker
        # Every micro-step (and so every optimizer step of batch x accum) holds the same number
        # of examples of every cluster.
        per_step = batch * accum
        for s in range(m // per_step):
            counts = [len(sched.order[e][w][s * per_step : (s + 1) * per_step]) for w in range(k)]
            assert counts == [per_step] * k
    assert sched.worker_weights == [0.5 + c for c in range(k)]
    assert all(sched.weight(i, w) == 0.5 + w for w in range(k) for i in sched.order[0][w])


def test_same_seed_same_schedule_and_epochs_differ() -> None:
    alloc = ALLOCATORS.create("cluster-interleave", {}, "k")
    a = alloc.allocate(_balanced(4, 10), 4, seed=3, epochs=2)
    b = alloc.allocate(_balanced(4, 10), 4, seed=3, epochs=2)
    c = alloc.allocate(_balanced(4, 10), 4, seed=4, epochs=2)
    assert a.order == b.order and a.order != c.order
    assert a.order[0] != a.order[1]
    assert a.worker_weights == [1.0] * 4  # weight_mode none


def test_unequal_clusters_interleave_round_robin_with_per_example_weights() -> None:
    # prune 'none' keeps unequal clusters: positions i -> worker i mod K, clusters mix at the end.
    sel = Selection(
        ids=["a0", "a1", "a2", "a3", "b0"], clusters=[0, 0, 0, 0, 1], group_weights={0: 1.6, 1: 0.4}
    )
    sched = ALLOCATORS.create("cluster-interleave", {}, "k").allocate(sel, 2, 0, 1, "rank")
    assert len(sched.order[0][0]) == len(sched.order[0][1]) == 2  # tail dropped for lockstep
    for w in range(2):
        for i in sched.order[0][w]:
            assert sched.weight(i, w) == (1.6 if i.startswith("a") else 0.4)


def test_k1_and_errors() -> None:
    alloc = ALLOCATORS.create("cluster-interleave", {}, "k")
    one = alloc.allocate(_balanced(1, 5), 1, 0)
    assert sorted(one.order[0][0]) == sorted(_balanced(1, 5).ids)
    with pytest.raises(SelectionError, match="needs a selection with clusters"):
        alloc.allocate(Selection(ids=["a", "b"]), 2, 0)
    with pytest.raises(SelectionError, match="clusters 0..3"):
        alloc.allocate(_balanced(2, 3), 4, 0)
