"""Registries, the first selectors and the standard allocator."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.core.config.builder import ConfigError
from repro.core.config.load import from_dict
from repro.core.interfaces import Allocator, SelectionContext, SelectionError, Selector, resolve_budget
from repro.core.registry import ALLOCATORS, SELECTORS
from repro.core.types import Example, Pool, Selection


def _pool(n: int) -> Pool:
    return Pool([Example(id=f"x{i:03d}", prompt="p", response="r", source="t") for i in range(n)])


def _ctx(tmp_path: Path, seed: int = 0) -> SelectionContext:
    return SelectionContext(config=from_dict({}), seed=seed, world_size=4, workdir=tmp_path)


def test_builtins_are_registered_and_satisfy_the_protocols() -> None:
    assert {"full", "random"} <= set(SELECTORS.names())
    assert "uniform-shuffle" in ALLOCATORS.names()
    assert isinstance(SELECTORS.create("random", {}, "selection.params"), Selector)
    assert isinstance(ALLOCATORS.create("uniform-shuffle", {}, "allocation.params"), Allocator)


def test_unknown_names_and_params_get_suggestions() -> None:
    with pytest.raises(ConfigError, match=r"unknown selector 'randm'\. Did you mean 'random'"):
        SELECTORS.get("randm")
    with pytest.raises(
        ConfigError,
        match=r"selection\.params\.seed_ofset.*did you mean "
        r"selection\.params\.seed_offset",
    ):
        SELECTORS.create("random", {"seed_ofset": 1}, "selection.params")
    with pytest.raises(ConfigError, match="cannot import"):
        SELECTORS.get("no_such_module_xyz:Thing")


def test_module_colon_class_names_resolve() -> None:
    assert SELECTORS.get("baselines.random:RandomSelector").registry_name == "random"


def test_random_is_seeded_uniform_and_exact(tmp_path: Path) -> None:
    pool = _pool(200)
    sel = SELECTORS.create("random", {}, "k")
    a = sel.select(pool, 50, _ctx(tmp_path, seed=1))
    b = sel.select(pool, 50, _ctx(tmp_path, seed=1))
    c = sel.select(pool, 50, _ctx(tmp_path, seed=2))
    assert a.ids == b.ids and a.ids != c.ids
    assert len(a.ids) == 50 == len(set(a.ids)) and set(a.ids) <= set(pool.ids)
    # Uniform: over many seeds every example is picked about budget/N = 1/4 of the time.
    counts = dict.fromkeys(pool.ids, 0)
    for s in range(200):
        for i in sel.select(pool, 50, _ctx(tmp_path, seed=s)).ids:
            counts[i] += 1
    assert 0.15 < min(counts.values()) / 200 and max(counts.values()) / 200 < 0.37


def test_budgets() -> None:
    assert resolve_budget(0.25, None, 100) == 25
    assert resolve_budget(0.001, None, 100) == 1  # never zero
    assert resolve_budget(None, 7, 10) == 7
    assert resolve_budget(None, None, 10) is None
    with pytest.raises(SelectionError, match="larger than the pool"):
        resolve_budget(None, 11, 10)
    with pytest.raises(SelectionError, match="empty"):
        resolve_budget(0.5, None, 0)


def test_full_refuses_a_smaller_budget(tmp_path: Path) -> None:
    with pytest.raises(SelectionError, match="keeps all"):
        SELECTORS.create("full", {}, "k").select(_pool(10), 5, _ctx(tmp_path))


def test_uniform_shuffle_matches_distributed_sampler() -> None:
    from torch.utils.data import DistributedSampler

    ids = [f"x{i}" for i in range(23)]
    sched = ALLOCATORS.create("uniform-shuffle", {}, "k").allocate(Selection(ids=ids), 4, seed=7, epochs=2)
    for epoch in range(2):
        for rank in range(4):
            s = DistributedSampler(list(range(23)), num_replicas=4, rank=rank, shuffle=True, seed=7)
            s.set_epoch(epoch)
            assert sched.order[epoch][rank] == [ids[i] for i in s]
    assert sched.order[0] != sched.order[1]  # reshuffled each epoch
    assert sched.worker_weights == [1.0] * 4


def test_rank_weights_need_group_weights() -> None:
    alloc = ALLOCATORS.create("uniform-shuffle", {}, "k")
    with pytest.raises(SelectionError, match="weight_mode 'rank' needs"):
        alloc.allocate(Selection(ids=["a", "b"]), 2, 0, weight_mode="rank")
    sel = Selection(ids=["a", "b", "c", "d"], clusters=[0, 1, 0, 1], group_weights={0: 0.5, 1: 1.5})
    sched = alloc.allocate(sel, 2, 0, weight_mode="rank")
    for k in range(2):
        for i in sched.order[0][k]:
            assert sched.weight(i, k) == {"a": 0.5, "c": 0.5, "b": 1.5, "d": 1.5}[i]


def test_a_third_party_selector_registers_through_its_entry_point(tmp_path: Path, monkeypatch) -> None:
    """An installed distribution's entry point is found without touching this repository.

    The distribution is real metadata on sys.path (a .dist-info folder with entry_points.txt),
    which is what `pip install` leaves behind; importlib.metadata discovers it the same way.
    """
    import importlib
    import sys

    pkg = tmp_path / "acme_select"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from dataclasses import dataclass\n"
        "from repro.core.types import Selection\n"
        "class FirstN:\n"
        "    '''Keeps the first `budget` examples.'''\n"
        "    @dataclass\n"
        "    class Params:\n"
        "        pass\n"
        "    def __init__(self, params):\n"
        "        self.params = params\n"
        "    def select(self, pool, budget, ctx):\n"
        "        return Selection(ids=pool.ids[:budget])\n"
    )
    dist = tmp_path / "acme_select-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-select\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cluster_repro.selectors]\nfirst-n = acme_select:FirstN\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        assert "first-n" in SELECTORS.names()
        assert "acme-select" in SELECTORS.origin("first-n")
        sel = SELECTORS.create("first-n", {}, "selection.params")
        assert sel.select(_pool(10), 3, _ctx(tmp_path)).ids == ["x000", "x001", "x002"]
    finally:
        SELECTORS._items.pop("first-n", None)
        sys.modules.pop("acme_select", None)
