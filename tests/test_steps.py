"""Optimizer steps from a schedule (repro/core/steps.py), the predicted straggler idle share, token
budgets (method/clustering.py) and steps balanced in tokens (method/allocation.py).

Arithmetic on hand-made schedules and synthetic token lengths, and `select`/`validate` printing
the prediction (tiny model, no training). The trainer's side (the same steps, run by real gloo
DDP) is in tests/test_trainer.py; the pipeline's (step_tokens.json against the training log) in
tests/test_demo.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from method import clustering as C
from method.allocation import ClusterInterleaveAllocator, UniformShuffleAllocator, token_balanced_split
from repro.core import steps
from repro.core.config.builder import ConfigError
from repro.core.interfaces import AllocationContext, SelectionError
from repro.core.types import Schedule, Selection


def test_idle_share_of_a_hand_made_schedule() -> None:
    # Two workers, steps of 2 ids (per-device batch 1 x accumulation 2), one epoch.
    sched = Schedule(order=[[["a", "b", "c", "d"], ["e", "f", "g", "h"]]], worker_weights=[1, 1])
    lengths = dict(a=10, b=30, c=20, d=20, e=40, f=40, g=5, h=15)
    sums = steps.step_token_sums(sched, lengths, per_step=2, steps_per_epoch=2, total_steps=2)
    assert sums.tolist() == [[40, 80], [40, 20]]
    # Step 1: worker 0 idles 1 - 40/80 = 0.5, worker 1 none; step 2: worker 1 idles 0.5.
    assert steps.worker_idle_shares(sums).tolist() == [0.25, 0.25]
    assert steps.idle_share(sums) == pytest.approx((1 - 60 / 80 + 1 - 30 / 40) / 2)  # 0.25
    # One step cap (train.max_steps): only the steps the trainer runs count.
    assert steps.step_token_sums(sched, lengths, 2, 2, 1).tolist() == [[40, 80]]
    # With step sizes (a balanced schedule) worker 1's first step takes three ids.
    sched.step_sizes = [[[2, 2], [3, 1]]]
    sums = steps.step_token_sums(sched, lengths, per_step=2, steps_per_epoch=2, total_steps=2)
    assert sums.tolist() == [[40, 85], [40, 15]]
    assert steps.idle_share(sums) == pytest.approx(((1 - 62.5 / 85) + (1 - 27.5 / 40)) / 2)
    summary = steps.straggler_summary(sched, lengths, 2, 2, 2)
    assert summary["step_tokens"] == sums.tolist() and summary["steps"] == 2
    assert summary["predicted_idle_share"] == pytest.approx(steps.idle_share(sums))
    one = Schedule(order=[[["a", "b"]]], worker_weights=[1.0])
    assert steps.straggler_summary(one, lengths, 2, 1, 1)["predicted_idle_share"] is None
    with pytest.raises(ValueError, match="steps x workers"):
        steps.idle_share(np.zeros((0, 2)))


def test_micro_batches_fixed_and_even() -> None:
    ids = list("abcde")
    assert steps.micro_batches(ids[:4], 2, 2, even=False) == [["a", "b"], ["c", "d"]]
    # A balanced step: near-equal parts, the larger first, none empty.
    assert steps.micro_batches(ids, 3, 1, even=True) == [["a", "b"], ["c", "d"], ["e"]]
    assert steps.micro_batches(ids[:2], 2, 4, even=True) == [["a"], ["b"]]


def _two_length_clusters(n0: int, n1: int, seed: int = 0) -> tuple[Selection, dict[str, int]]:
    """Cluster 0 of short examples, cluster 1 of long ones (lengths 20-80 and 60-240)."""
    rng = np.random.default_rng(seed)
    ids = [f"s{i}" for i in range(n0)] + [f"l{i}" for i in range(n1)]
    lengths = {i: int(rng.integers(20, 80)) for i in ids[:n0]}
    lengths.update({i: int(rng.integers(60, 240)) for i in ids[n0:]})
    sel = Selection(ids=ids, clusters=[0] * n0 + [1] * n1, group_weights={0: 1.2, 1: 0.8})
    return sel, lengths


def test_token_balanced_split_cuts_near_the_target() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(10, 200, size=500).tolist()
    sizes = token_balanced_split(lengths, steps=7, min_size=16)
    assert sum(sizes) == 500 and len(sizes) == 7 and min(sizes) >= 16
    sums = np.add.reduceat(lengths, np.cumsum([0] + sizes[:-1]))
    assert np.abs(sums - sum(lengths) / 7).max() <= 2 * max(lengths)  # two boundaries' worth
    with pytest.raises(SelectionError, match="cannot cut"):
        token_balanced_split([5] * 10, steps=3, min_size=4)


def test_balance_tokens_gives_equal_steps_and_near_equal_token_sums() -> None:
    # Clusters whose token totals are about equal (what budget_unit: tokens gives) but whose
    # lengths differ: the short cluster (mean 50 tokens) has three times the examples.
    sel, lengths = _two_length_clusters(1800, 600)
    k, accum = 2, 64
    ctx = AllocationContext(lengths, per_device_batch=1, grad_accum=accum, drop_last=True)
    bal = ClusterInterleaveAllocator(balance="tokens").allocate(
        sel, k, seed=3, epochs=2, weight_mode="rank", ctx=ctx
    )
    counts = {len(sizes) for epoch in bal.step_sizes for sizes in epoch}
    assert counts == {600 // accum}  # every worker: the steps of the fewest examples
    for e in range(2):
        for w in range(k):
            assert sum(bal.step_sizes[e][w]) == len(bal.order[e][w])  # nothing dropped
            assert min(bal.step_sizes[e][w]) >= accum  # every micro-step holds an example
            assert {bal.clusters[i] for i in bal.order[e][w]} == {w}  # cluster k on worker k
    assert bal.worker_weights == [1.2, 0.8] and not bal.example_weights
    s = bal.steps_per_epoch()
    sums = steps.step_token_sums(bal, lengths, accum, s, 2 * s)
    totals = [sum(lengths[i] for i in ids) for ids in bal.order[0]]
    floor = 1 - np.mean(totals) / max(totals)  # what unequal totals alone cost
    assert floor < 0.02 and steps.idle_share(sums) < floor + 0.01

    # The same examples in steps of 64 examples: the short worker idles about half of each step.
    plain = ClusterInterleaveAllocator().allocate(
        Selection(
            ids=sel.ids[:600] + sel.ids[1800:],
            clusters=[0] * 600 + [1] * 600,
            group_weights=sel.group_weights,
        ),
        k,
        seed=3,
        weight_mode="rank",
    )
    plain_sums = steps.step_token_sums(plain, lengths, accum, 600 // accum, 600 // accum)
    assert steps.idle_share(plain_sums) > 0.3
    with pytest.raises(SelectionError, match="token lengths"):
        ClusterInterleaveAllocator(balance="tokens").allocate(sel, k, seed=3)
    with pytest.raises(ConfigError, match="allocation.params.balance: 'examples' is not allowed"):
        ClusterInterleaveAllocator(balance="examples")


def test_balanced_steps_keep_the_plain_interleaves_objective() -> None:
    """The objective a step optimizes is sum_k (w_k / K) * sum_{i in worker k's step} l_i / d_k
    (steps.step_objective: d = accumulation for fixed steps at per-device batch 1, the worker's
    mean examples per step for balanced ones). Over an epoch its mean over steps must be
    sum_k (w_k / K) * mean_{i in cluster k} l_i under both: each cluster's share of the objective
    is its rank weight, whatever its steps hold. l_i stands for any per-example quantity the
    loss is linear in (loss, gradient)."""
    sel, lengths = _two_length_clusters(1200, 600, seed=4)
    loss = {i: float(v) for i, v in zip(sel.ids, np.random.default_rng(5).normal(size=1800))}
    k, accum = 2, 50

    def epoch_objective(sched: Schedule, n_steps: int) -> float:
        total = 0.0
        for s in range(n_steps):
            for w in range(k):
                per_example, d = steps.step_objective(sched, 0, w, accum)
                ids = steps.step_ids(sched, 0, w, s, accum)
                total += sched.worker_weights[w] / k * sum(loss[i] for i in ids) / d
        return total / n_steps

    def target(sched: Schedule) -> float:
        return sum(
            sched.worker_weights[w] / k * np.mean([loss[i] for i in sched.order[0][w]]) for w in range(k)
        )

    # Plain interleave on equal clusters of 600 (12 steps of 50, nothing dropped).
    equal = Selection(
        ids=sel.ids[:600] + sel.ids[1200:], clusters=[0] * 600 + [1] * 600, group_weights=sel.group_weights
    )
    plain = ClusterInterleaveAllocator().allocate(equal, k, seed=6, weight_mode="rank")
    assert steps.step_objective(plain, 0, 0, accum) == (False, accum)
    assert epoch_objective(plain, 12) == pytest.approx(target(plain), rel=1e-12)
    ctx = AllocationContext(lengths, 1, accum, True)
    for s in (equal, sel):  # equal clusters, and unequal ones (a token budget's)
        bal = ClusterInterleaveAllocator(balance="tokens").allocate(s, k, seed=6, weight_mode="rank", ctx=ctx)
        assert steps.step_objective(bal, 0, 0, accum)[0] is True
        assert epoch_objective(bal, bal.steps_per_epoch()) == pytest.approx(target(bal), rel=1e-12)
    # Same examples, same clusters: the balanced schedule's objective is the plain one's.
    bal_equal = ClusterInterleaveAllocator(balance="tokens").allocate(
        equal, k, 6, weight_mode="rank", ctx=ctx
    )
    assert epoch_objective(bal_equal, bal_equal.steps_per_epoch()) == pytest.approx(
        epoch_objective(plain, 12), rel=1e-12
    )


def test_random_allocation_keeps_example_counts_per_step() -> None:
    sel, lengths = _two_length_clusters(100, 100)
    sched = UniformShuffleAllocator().allocate(sel, 2, seed=0, ctx=AllocationContext(lengths, 1, 4))
    assert sched.step_sizes is None and sched.steps_per_epoch() is None


@pytest.mark.parametrize("mode", ["close", "far", "mix", "big"])
def test_member_order_prefixes_are_what_choose_within_cluster_keeps(mode: str) -> None:
    rng = np.random.default_rng(7)
    X = rng.normal(size=(60, 5)).astype(np.float32)
    labels = np.arange(60) % 3
    centers = np.stack([X[labels == c].mean(axis=0) for c in range(3)])
    order = C.member_order(X, centers, labels, mode, seed=1)
    for m in (1, 2, 7, 20):
        kept = C.choose_within_cluster(X, centers, labels, m, mode, seed=1)
        for c in range(3):
            assert set(order[c][:m].tolist()) == set(kept[c].tolist()), (mode, m, c)
    assert all(sorted(order[c].tolist()) == np.flatnonzero(labels == c).tolist() for c in range(3))


def test_token_budget_keeps_equal_token_totals_within_one_example() -> None:
    rng = np.random.default_rng(8)
    labels = np.repeat([0, 1, 2], [50, 80, 40])
    lengths = np.concatenate(
        [rng.integers(100, 300, 50), rng.integers(20, 90, 80), rng.integers(50, 400, 40)]
    )
    order = {c: rng.permutation(np.flatnonzero(labels == c)) for c in range(3)}
    smallest = min(int(lengths[idx].sum()) for idx in order.values())
    for ratio in (100, 50):
        budget, kept = C.token_budget(order, lengths, ratio)
        assert budget == smallest * ratio // 100
        for c, idx in kept.items():
            assert np.array_equal(idx, order[c][: idx.size])  # a prefix of the cluster's order
            total = int(lengths[idx].sum())
            assert total <= budget
            if idx.size < order[c].size:  # the next example would not fit
                assert total + int(lengths[order[c][idx.size]]) > budget
        totals = [int(lengths[idx].sum()) for idx in kept.values()]
        assert max(totals) - min(totals) < lengths.max()
    with pytest.raises(SelectionError, match="first example alone"):
        C.token_budget({0: np.array([0]), 1: np.array([1, 2])}, np.array([100, 1, 1]), 100)


def test_select_and_validate_print_the_predicted_idle_share(tmp_path, capsys) -> None:
    import json

    from repro.cli import main
    from tests.conftest import CONFIGS

    args = [
        str(CONFIGS / "demo-quick.yaml"),
        f"output_dir={tmp_path}",
        "world_size=2",
        "selection.method=full",
    ]
    assert main(["validate", *args]) == 0
    assert "predicted idle share: not known yet" in capsys.readouterr().out
    assert main(["select", *args]) == 0
    run_dir = next(tmp_path.glob("*/*"))
    summary = json.loads((run_dir / "step_tokens.json").read_text())
    line = f"predicted idle share: {100 * summary['predicted_idle_share']:.1f}% of each optimizer step"
    assert line in capsys.readouterr().err
    assert main(["validate", *args]) == 0
    assert line in capsys.readouterr().out
