"""Issue 26, classes 1-3: a plugin cannot bend a comparison; two experiments never share a name;
preflight catches what would fail after work (kept-count matching, a selection too small).

The plugins are real classes in a package written to a temporary folder on sys.path (what a
user's `mypkg/sel.py` is), named as `module:Class`, run through the real pipeline where the case
needs it; the contract checks themselves are also called directly on a real pool."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from repro.cli import main
from repro.contracts import PLUGIN_ERROR_LOG, check_schedule, check_selection
from repro.core.config.builder import ConfigError
from repro.core.config.load import load_config, resolve_config_path
from repro.core.interfaces import SelectionError
from repro.core.types import Example, Pool, Schedule, Selection, SelectionDiagnostics

BASE = resolve_config_path("demo-quick", "base config")

PLUGINS = """
import math
from dataclasses import dataclass

from repro.core.params import Parameterized
from repro.core.types import Selection, Schedule


class Plugin(Parameterized):
    @dataclass
    class Params:
        pass


def _four(pool, n):
    ids = pool.ids[:n]
    return ids, [i % 4 for i in range(len(ids))]


class NegWeight(Plugin):
    def select(self, pool, budget, ctx):
        ids, cl = _four(pool, budget)
        return Selection(ids=ids, clusters=cl, group_weights={0: 1.0, 1: 1.0, 2: 1.0, 3: -1.0})


class NaNWeight(Plugin):
    def select(self, pool, budget, ctx):
        ids, cl = _four(pool, budget)
        return Selection(ids=ids, clusters=cl, group_weights={0: math.nan, 1: 1.0, 2: 1.0, 3: 1.0})


class AllIds(Plugin):
    def select(self, pool, budget, ctx):
        return Selection(ids=list(pool.ids))


class Boom(Plugin):
    def select(self, pool, budget, ctx):
        raise RuntimeError("boom inside the plugin")


class ReturnsList(Plugin):
    def select(self, pool, budget, ctx):
        return list(pool.ids[:budget])


class InitBoom(Plugin):
    def setup(self):
        raise RuntimeError("cannot start")

    def select(self, pool, budget, ctx):
        return None


class NegWorker(Plugin):
    def allocate(self, selection, world_size, seed, epochs=1, weight_mode="none", ctx=None):
        ids = selection.ids
        per = len(ids) // world_size
        order = [[ids[k * per:(k + 1) * per] for k in range(world_size)] for _ in range(epochs)]
        return Schedule(order=order, worker_weights=[1.0] * (world_size - 1) + [-2.0])


class AllocBoom(Plugin):
    def allocate(self, selection, world_size, seed, epochs=1, weight_mode="none", ctx=None):
        raise KeyError("worker")
"""


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pkg = tmp_path / "plugins" / "mypkg_h26"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sel.py").write_text(textwrap.dedent(PLUGINS))
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    return "mypkg_h26.sel"


def _select(tmp_path: Path, *overrides: str) -> int:
    return main(["select", "demo-quick", f"output_dir={tmp_path / 'runs'}", *overrides])


# ----------------------------------------------------------------------------- class 1, end to end


@pytest.mark.parametrize(
    ("plugin", "extra", "expect"),
    [
        (
            "NegWeight",
            ["allocation.method=cluster-interleave", "allocation.weight_mode=rank"],
            "finite positive",
        ),
        ("NaNWeight", ["allocation.method=cluster-interleave", "allocation.weight_mode=rank"], "nan"),
        ("AllIds", [], "returned 96 ids for a budget of 24"),
        ("Boom", [], "failed: RuntimeError: boom inside the plugin"),
        ("ReturnsList", [], "returned list, not repro.core.types.Selection"),
        ("InitBoom", [], "could not be created with {}: RuntimeError: cannot start"),  # preflight
    ],
)
def test_a_selector_plugin_cannot_bend_the_run(plugins, tmp_path, capsys, plugin, extra, expect):
    rc = _select(tmp_path, f"selection.method={plugins}:{plugin}", "selection.n=24", *extra)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"selector '{plugins}:{plugin}'" in err and expect in err
    assert "Traceback" not in err
    if plugin == "InitBoom":  # refused before anything ran
        assert not (tmp_path / "runs").exists()
        return
    run = next((tmp_path / "runs").glob("*/*"))
    assert not (run / "selection.json").exists()  # nothing was handed over
    if plugin == "Boom":  # its traceback in the run folder, not on screen
        log = (run / PLUGIN_ERROR_LOG).read_text()
        assert "Traceback" in log and "sel.py" in log


@pytest.mark.parametrize(
    ("plugin", "expect"), [("NegWorker", "worker_weights"), ("AllocBoom", "failed: KeyError")]
)
def test_an_allocator_plugin_cannot_bend_the_run(plugins, tmp_path, capsys, plugin, expect):
    rc = _select(
        tmp_path, "selection.method=random", "selection.n=24", f"allocation.method={plugins}:{plugin}"
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"allocator '{plugins}:{plugin}'" in err and expect in err, err
    run = next((tmp_path / "runs").glob("*/*"))
    assert not (run / "schedule.json").exists()


# ----------------------------------------------------------------------------- class 1, each field


@pytest.fixture(scope="module")
def pool() -> Pool:
    return Pool([Example(f"e{i}", "p", "r", "s") for i in range(12)])


def _bad(sel, pool, match, budget=None, exact=False):
    with pytest.raises(SelectionError, match=match) as e:
        check_selection(sel, pool, "mine", budget, exact)
    assert "selector 'mine'" in str(e.value)


def test_selection_contract_field_by_field(pool):
    ids = pool.ids
    _bad(Selection(ids=[]), pool, "kept nothing")
    _bad(Selection(ids=["nope", *ids[:2]]), pool, "not in the pool")
    _bad(Selection(ids=[ids[0], ids[0]]), pool, "duplicate")
    _bad(Selection(ids=[0, 1]), pool, "list of pool id strings")  # type: ignore[list-item]
    _bad(Selection(ids=ids[:5]), pool, "for a budget of 4", budget=4)
    _bad(Selection(ids=ids[:3]), pool, "says it meets its budget", budget=4, exact=True)
    _bad(Selection(ids=ids[:2], clusters=[0]), pool, "clusters has 1 entries")
    _bad(Selection(ids=ids[:2], clusters=[0, -1]), pool, "clusters must be")
    _bad(Selection(ids=ids[:2], clusters=[0, 1.5]), pool, "clusters must be")  # type: ignore[list-item]
    _bad(Selection(ids=ids[:2], clusters=[0, True]), pool, "clusters must be")  # type: ignore[list-item]
    _bad(Selection(ids=ids[:2], clusters=[0, 4], info={"k": 4}), pool, r"0\.\.3")
    _bad(Selection(ids=ids[:2], scores=[1.0, math.inf]), pool, "finite numbers")
    _bad(Selection(ids=ids[:2], clusters=[0, 1], group_weights={0: 1.0, 1: 0.0}), pool, "finite positive")
    _bad(
        Selection(ids=ids[:2], clusters=[0, 1], group_weights={0: 1.0, 1: math.inf}), pool, "finite positive"
    )
    _bad(
        Selection(ids=ids[:2], clusters=[0, 1], group_weights={0: 1.0}), pool, r"no weight for clusters \[1\]"
    )
    _bad(Selection(ids=ids[:2], group_weights={0: 1.0}), pool, "without clusters")
    _bad(Selection(ids=ids[:2], clusters=[0, 1], group_weights={0: 1.0, 1: True}), pool, "finite positive")
    # what keeps the contract passes: with_replacement repeats, fewer than the budget
    repeats = SelectionDiagnostics(with_replacement=True)
    check_selection(Selection(ids=[ids[0], ids[0]], diagnostics=repeats), pool, "m", 2)
    said_in_info = Selection(ids=[ids[0], ids[0]], info={"with_replacement": True})
    _bad(said_in_info, pool, "set diagnostics.with_replacement")
    untyped = Selection(ids=ids[:2], diagnostics={"with_replacement": True})
    _bad(untyped, pool, "must be a .*SelectionDiagnostics")
    check_selection(Selection(ids=ids[:3], clusters=[0, 1, 1], group_weights={0: 2, 1: 0.5}), pool, "m", 4)


def test_schedule_contract_field_by_field():
    cfg = load_config("demo-quick", ["world_size=2", "train.global_batch_size=4", "train.epochs=1"])
    ok = Schedule(order=[[["a", "b"], ["c", "d"]]], worker_weights=[1.0, 1.0])
    check_schedule(ok, cfg, 1, ["a", "b", "c", "d"])

    def bad(sched, match, selected=("a", "b", "c", "d")):
        with pytest.raises(SelectionError, match=match) as e:
            check_schedule(sched, cfg, 1, list(selected))
        assert "allocator 'uniform-shuffle'" in str(e.value)

    bad({"order": []}, "returned dict, not repro.core.types.Schedule")
    bad(Schedule(order=[[["a", "b"], ["c", "d"]]], worker_weights=[1.0, math.nan]), "worker_weights")
    bad(Schedule(order=[[["a", "b"], ["c", "d"]]], worker_weights=[1.0, 0.0]), "worker_weights")
    bad(
        Schedule(order=[[["a", "b"], ["c", "d"]]], worker_weights=[1.0, 1.0], example_weights={"a": -1.0}),
        "example_weights",
    )
    bad(Schedule(order=[[["a", "b"], ["c", "x"]]], worker_weights=[1.0, 1.0]), "does not hold")
    bad(Schedule(order=[[["a", "b"], ["c"]]], worker_weights=[1.0, 1.0]), "uneven")
    bad(Schedule(order=[[["a", "b"], ["c", "d"]]], worker_weights=[1.0]), "1 workers")
    bad(Schedule(order=[[[], []]], worker_weights=[1.0, 1.0]), "no ids")


# ----------------------------------------------------------------------------- class 2


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_a_run_list_label_names_one_run(tmp_path, capsys):
    rl = _write(
        tmp_path / "runs.yaml",
        f"""
        base: {BASE}
        runs:
          - {{label: x, overrides: [selection.method=random, selection.n=24]}}
          - {{label: x, overrides: [selection.method=random, selection.n=32]}}
        """,
    )
    assert main(["grid", str(rl)]) == 2
    err = capsys.readouterr().err
    assert "runs[0] and runs[1] are both labelled 'x'" in err


@pytest.mark.parametrize(
    ("axis", "expect"),
    [
        ("ratios: [50, 50.0]", r"\[0\] = 50 and \[1\] = 50.0"),
        ("world_sizes: [4, 4]", r"world_sizes: \[0\] = 4 and \[1\] = 4"),
    ],
)
def test_a_grid_cell_is_planned_once(tmp_path, axis, expect):
    from repro.experiments.experiment import load_experiment

    ws = "" if axis.startswith("world_sizes") else "world_sizes: [4]"
    ratios = axis if axis.startswith("ratios") else "ratios: [50]"
    g = _write(
        tmp_path / "g.yaml",
        f"""
        name: dup
        base: {BASE}
        grid:
          datasets: {{demo: {{}}}}
          models: {{tiny: {{}}}}
          methods:
            cluster: {{overrides: [selection.method=cluster], {ratios}}}
          {ws or axis}
          seeds: [0]
        """,
    )
    with pytest.raises(ConfigError, match=expect):
        load_experiment(g)


def test_two_methods_that_name_one_cell_are_refused(tmp_path):
    from repro.experiments.experiment import load_experiment

    g = _write(
        tmp_path / "g.yaml",
        f"""
        name: dup
        base: {BASE}
        grid:
          datasets: {{demo: {{}}}}
          models: {{tiny: {{}}}}
          methods:
            cluster: {{overrides: [selection.method=cluster], ratios: [50]}}
            cluster-r50: {{overrides: [selection.method=random, selection.n=24]}}
          world_sizes: [4]
          seeds: [0]
        """,
    )
    with pytest.raises(ConfigError, match=r"two cells are both demo\.tiny\.cluster-r50\.ws4\.s0"):
        load_experiment(g)


# ----------------------------------------------------------------------------- class 3


def test_matching_a_selector_that_sets_its_own_count_fails_before_anything_runs(tmp_path, capsys):
    rl = _write(
        tmp_path / "runs.yaml",
        f"""
        base: {BASE}
        overrides: [output_dir={tmp_path / "out"}]
        runs:
          - {{label: a, overrides: [selection.method=random, selection.n=24]}}
          - {{label: b, match_kept_count_of: a, overrides: [selection.method=full]}}
        """,
    )
    assert main(["grid", str(rl)]) == 2
    err = capsys.readouterr().err
    assert "runs[1] (b): match_kept_count_of: selector 'full' sets its own kept count" in err
    assert not (tmp_path / "out").exists()  # run a did not train first


def test_a_selection_too_small_for_one_micro_batch_is_refused_before_select(tmp_path, capsys):
    assert _select(tmp_path, "selection.method=random", "selection.fraction=1e-9") == 2
    err = capsys.readouterr().err
    assert "gives 1 examples, fewer than one micro-batch per worker needs: world_size 4 x " in err
    assert "= 8" in err and not (tmp_path / "runs").exists()


def test_uniform_shuffle_pads_any_small_selection():
    from method.allocation import UniformShuffleAllocator

    for n, k in ((1, 2), (1, 8), (3, 8), (5, 4)):
        sel = Selection(ids=[f"x{i}" for i in range(n)])
        sched = UniformShuffleAllocator().allocate(sel, k, seed=0, epochs=2)
        assert {len(w) for e in sched.order for w in e} == {-(-n // k)}
        assert {i for e in sched.order for w in e for i in w} == set(sel.ids)
