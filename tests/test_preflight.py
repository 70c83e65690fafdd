"""Preflight (repro/preflight.py): what would fail only after training is found before anything
runs, in every shipped experiment file and config, and by validate, run, grid and launch."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from repro.core.config.builder import ConfigError
from repro.core.config.load import from_dict, load_config
from repro.core.params import Parameterized
from repro.core.registry import SELECTORS
from repro.experiments.experiment import load_experiment
from repro.preflight import preflight, require_clean
from repro.problems import CheckContext, PreflightError, Problem
from slurm.profile import ClusterProfile, load_profile
from tests.conftest import CONFIGS

EXPERIMENTS = sorted((CONFIGS / "experiments").glob("*.yaml"))
CONFIG_FILES = sorted(
    [*CONFIGS.glob("*.yaml"), *(CONFIGS / "mini").glob("*.yaml"), *(CONFIGS / "paper").glob("*.yaml")]
)


def _errors(problems: list[Problem]) -> list[str]:
    return [str(p) for p in problems if p.blocking]


def _quick(*overrides: str):
    return load_config(CONFIGS / "demo-quick.yaml", list(overrides))


class GoodSelector(Parameterized):
    """A plugin selector named as module:Class (keeps everything)."""

    @dataclass
    class Params:
        pass

    def select(self, pool, budget, ctx):  # pragma: no cover - only resolved, never run here
        raise AssertionError


def not_a_class():  # a plugin name that resolves to a function
    return None


# ----------------------------------------------------------------------------- every shipped file


@pytest.fixture
def data_env(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTER_REPRO_DATA", str(shared_data))
    return shared_data


def test_the_shipped_files_are_all_found() -> None:
    names = {p.relative_to(CONFIGS).as_posix() for p in [*EXPERIMENTS, *CONFIG_FILES]}
    assert {
        "experiments/paper.yaml",
        "experiments/paper-baselines.yaml",
        "experiments/demo-ablation.yaml",
        "demo.yaml",
        "mini/medical.yaml",
        "paper/recipe.yaml",
    } <= names


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_cell_of_every_shipped_experiment_file_passes_preflight(path: Path, data_env: Path) -> None:
    """As the command its header names checks it: `launch` with the example cluster profile, `grid`
    on this machine."""
    launched = "cluster-repro launch" in path.read_text().split("\nbase:")[0]
    ctx = CheckContext(profile=load_profile(CONFIGS / "clusters" / "example.yaml")) if launched else None
    cells = load_experiment(path).cells
    bad = {c.id: _errors(preflight(c.check_config(), ctx)) for c in cells}
    assert not {k: v for k, v in bad.items() if v}
    assert len(bad) == len(cells) > 0


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_every_shipped_config_passes_preflight(path: Path, data_env: Path) -> None:
    assert _errors(preflight(load_config(path))) == []


def test_the_paper_grids_name_the_medical_benchmarks_as_the_suite_does(data_env: Path) -> None:
    from evals.benchmarks import BENCHMARKS

    for name in ("paper.yaml", "paper-baselines.yaml"):
        med = [c for c in load_experiment(f"experiments/{name}").cells if c.axes["dataset"] == "medinstruct"]
        assert med and all(set(c.check_config().eval.benchmarks) <= set(BENCHMARKS) for c in med)


# ----------------------------------------------------------------------------- each check's message


def test_benchmark_names_get_a_did_you_mean() -> None:
    problems = preflight(_quick("eval.benchmarks=[medqa_4options,medmcq,hellaswag,medical]"))
    errs = _errors(problems)
    assert len(errs) == 3  # the alias `medical` is fine
    assert errs[0].startswith(
        "eval.benchmarks[0]: unknown benchmark 'medqa_4options'; did you "
        "mean 'medqa' (this suite's name for lm-eval's medqa_4options)?"
    )
    assert errs[1].startswith("eval.benchmarks[1]: unknown benchmark 'medmcq'; did you mean 'medmcqa'?")
    assert errs[2].startswith("eval.benchmarks[2]: unknown benchmark 'hellaswag' (known: humaneval, ")


def test_missing_benchmark_data_is_a_note_not_an_error(tmp_path: Path) -> None:
    problems = preflight(_quick(f"data_dir={tmp_path}", "eval.benchmarks=[medqa]"))
    assert _errors(problems) == []
    notes = [str(p) for p in problems if not p.blocking]
    assert len(notes) == 1 and "medqa" in notes[0] and str(tmp_path) in notes[0]
    assert "'missing' row" in notes[0]


def test_selector_and_allocator_names_get_a_did_you_mean() -> None:
    errs = _errors(preflight(_quick("selection.method=clusterr", "allocation.method=cluster-interleav")))
    assert errs[0].startswith("selection.method: unknown selector 'clusterr'. Did you mean 'cluster'?")
    assert errs[1].startswith(
        "allocation.method: unknown allocator 'cluster-interleav'. Did you mean 'cluster-interleave'?"
    )


def test_selector_params_are_checked_against_the_selector() -> None:
    errs = _errors(preflight(_quick("selection.method=cluster", "selection.params.ratoi=50")))
    assert len(errs) == 1
    assert errs[0].startswith(
        "selection.params.ratoi: selector 'cluster' takes no parameter "
        "'ratoi'; did you mean selection.params.ratio? (it takes: ratio, "
    )
    assert "feature_batch_size" in errs[0]
    errs = _errors(preflight(_quick("selection.method=cluster", "selection.params.prune=closest")))
    assert errs == [
        "selection.params.prune: 'closest' is not allowed; expected one of 'close', 'far', 'rand', "
        "'mix', 'big', 'none' (did you mean 'close'?)"
    ]


def test_plugin_selectors_must_import_and_be_classes_with_select() -> None:
    ok = _quick(f"selection.method={__name__}:GoodSelector")
    assert _errors(preflight(ok)) == []
    errs = _errors(preflight(_quick(f"selection.method={__name__}:not_a_class")))
    assert (
        len(errs) == 1
        and "not a selector class: expected a class with a select() method" in errs[0]
        and errs[0].startswith("selection.method: ")
    )
    errs = _errors(preflight(_quick("allocation.method=no_such_module:Alloc")))
    assert errs == [
        "allocation.method: allocator 'no_such_module:Alloc': cannot import: No module named 'no_such_module'"
    ]


def test_entry_point_plugins_count_and_are_checked(tmp_path: Path, monkeypatch) -> None:
    """A real .dist-info on sys.path (what pip leaves) advertises two selectors: a class and a
    function; the class passes, the function is named as not a selector class."""
    pkg = tmp_path / "acme_pf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from dataclasses import dataclass\n"
        "from repro.core.params import Parameterized\n"
        "class Keep(Parameterized):\n"
        "    @dataclass\n    class Params:\n        pass\n"
        "    def select(self, pool, budget, ctx):\n"
        "        return None\n\ndef keep(pool, budget, ctx):\n"
        "    return None\n"
    )
    dist = tmp_path / "acme_pf-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-pf\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[cluster_repro.selectors]\nacme-keep = acme_pf:Keep\nacme-fn = acme_pf:keep\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        assert _errors(preflight(_quick("selection.method=acme-keep"))) == []
        errs = _errors(preflight(_quick("selection.method=acme-fn")))
        assert len(errs) == 1 and "not a selector class" in errs[0]
    finally:
        for name in ("acme-keep", "acme-fn"):
            SELECTORS._items.pop(name, None)
            SELECTORS._from_entry_point.discard(name)
        sys.modules.pop("acme_pf", None)


def test_missing_data_files_are_named(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "pool.jsonl").write_text("{}\n")
    src = "data.sources=[{path: pool.jsonl}, {path: sub/nope.json, exclude_ids_file: ids.json}]"
    errs = _errors(preflight(_quick(f"data_dir={tmp_path}", src)))
    assert errs == [
        f"data.sources[1].path: file '{tmp_path / 'sub' / 'nope.json'}' not found ('sub/nope.json' "
        "relative to the data directory from data_dir)",
        f"data.sources[1].exclude_ids_file: file '{tmp_path / 'ids.json'}' not found ('ids.json' "
        "relative to the data directory from data_dir)",
    ]
    monkeypatch.delenv("CLUSTER_REPRO_DATA", raising=False)
    errs = _errors(preflight(_quick("data.sources=[{path: pool.jsonl}]")))
    assert errs == [
        "data.sources[0].path: 'pool.jsonl' is relative, but no data directory is "
        "set: set the config key data_dir or the environment variable "
        "CLUSTER_REPRO_DATA"
    ]
    errs = _errors(preflight(_quick("data.sources=[{path: pool.csv}]")))
    assert errs[0].startswith(
        "data.sources[0].path: 'pool.csv': expected a .json / .jsonl file (relative to data_dir), "
        "'hf:<hub id>', or a registered data source (`cluster-repro ls sources`); unknown data "
        "source 'pool.csv'. Known: demo."
    )


def test_hub_sources_are_a_note_and_the_profile_env_sets_the_data_dir(tmp_path: Path, monkeypatch) -> None:
    problems = preflight(_quick("data.sources=[{path: 'hf:org/set'}]", "eval.benchmarks=[]"))
    assert _errors(problems) == []
    assert [str(p) for p in problems] == [
        "data.sources[0].path: hf:org/set: a hub dataset, not checked here (it is fetched when "
        "the pool stage runs)"
    ]
    # A launched job sees the profile's env: data is looked for where the job will look.
    monkeypatch.delenv("CLUSTER_REPRO_DATA", raising=False)
    (tmp_path / "pool.jsonl").write_text("{}\n")
    cfg = _quick("data.sources=[{path: pool.jsonl}]")
    prof = ClusterProfile(env={"CLUSTER_REPRO_DATA": str(tmp_path)})
    assert _errors(preflight(cfg, CheckContext(profile=prof))) == []
    assert len(_errors(preflight(cfg))) == 1


def test_a_ratio_given_as_a_fraction_asks_for_the_percentage() -> None:
    errs = _errors(preflight(_quick("selection.method=cluster", "selection.params.ratio=0.5")))
    assert errs == [
        "selection.params.ratio: 0.5 looks like a fraction; it is a percentage (0-100, "
        "unlike selection.fraction's 0-1 share), did you mean 50?"
    ]
    errs = _errors(preflight(_quick("selection.method=cluster", "selection.params.ratio=0.75")))
    assert errs[0].endswith("did you mean 75?")
    assert preflight(_quick("selection.method=cluster", "selection.params.ratio=50")) == []
    one = preflight(_quick("selection.method=cluster", "selection.params.ratio=1"))
    assert _errors(one) == [] and "the paper's r = 1.0 is ratio 100" in str(one[0])


def test_batches_budget_and_world_size_against_the_profile() -> None:
    with pytest.raises(ConfigError, match="eval.limit: expected a number of items >= 1"):
        _quick("eval.limit=0")  # refused at load (repro/core/config/checks.py)
    errs = _errors(
        preflight(_quick("selection.method=random", "selection.n=500", "selection.params.seed_offset=1"))
    )
    assert errs == [
        "selection.n: 500 is larger than the pool can be (at most 96 examples from "
        "data.sources); use at most 96 or selection.fraction"
    ]
    errs = _errors(preflight(_quick("selection.method=cluster", "selection.params.feature_batch_size=0")))
    assert errs == ["selection.params.feature_batch_size: expected an integer >= 1, got 0"]
    errs = _errors(preflight(_quick("data.sources[0].params.train_size=16")))
    assert errs == [
        "data.sources[0].params.train_size: expected an integer >= 24 (2 per category: the "
        "generated pool has 12), got 16"
    ]
    cfg = _quick("world_size=6", "train.global_batch_size=12")
    assert _errors(preflight(cfg)) == []  # no profile: nothing to fit
    errs = _errors(preflight(cfg, CheckContext(profile=ClusterProfile(name="p", gpus_per_node=4))))
    assert errs == [
        "world_size: world_size 6 is not a multiple of the profile 'p''s "
        "gpus_per_node 4: a job must fill whole nodes"
    ]


def test_require_clean_names_every_config_with_a_problem() -> None:
    good = _quick()
    bad = _quick("selection.method=clusterr")
    with pytest.raises(PreflightError) as e:
        require_clean(
            [
                ("a.yaml", good),
                ("b.yaml", bad),
                ("c.yaml", from_dict({}, ["eval.benchmarks=[hellaswag]", "data.sources=[{path: demo}]"])),
            ]
        )
    msg = str(e.value)
    assert msg.startswith("2 problem(s) in 2 of 3 config(s), found before anything ran:")
    assert "  error  b.yaml: selection.method: unknown selector 'clusterr'" in msg
    assert "  error  c.yaml: eval.benchmarks[0]: unknown benchmark 'hellaswag'" in msg
    assert "a.yaml" not in msg


# ----------------------------------------------------------------------------- the commands


@pytest.fixture
def cli(capsys: pytest.CaptureFixture):
    """`cluster-repro ARGS` in this process -> (exit code, stdout, stderr)."""
    from repro.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        rc = main(list(args))
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def test_validate_run_and_grid_refuse_before_any_stage(tmp_path: Path, cli) -> None:
    quick = str(CONFIGS / "demo-quick.yaml")
    rc, out, err = cli("validate", quick, "eval.benchmarks=[hellaswag]", "selection.method=clusterr")
    assert rc == 2 and out == ""
    assert "eval.benchmarks[0]: unknown benchmark 'hellaswag'" in err
    assert "selection.method: unknown selector 'clusterr'. Did you mean 'cluster'?" in err
    rc, out, _ = cli("validate", quick, "--quiet")
    assert rc == 0 and out.startswith("config_hash: ")

    for cmd in ("run", "select"):
        rc, _, err = cli(
            cmd, quick, f"output_dir={tmp_path}", "selection.method=cluster", "selection.params.ratio=0.5"
        )
        assert rc == 2
        assert (
            "selection.params.ratio: 0.5 looks like a fraction; it is a percentage (0-100, "
            "unlike selection.fraction's 0-1 share), did you mean 50?" in err
        )
        assert not any(tmp_path.iterdir()), "nothing may run"

    runs = tmp_path / "runs.yaml"
    runs.write_text(
        f"base: {quick}\nruns:\n  - {{label: ok, overrides: [selection.method=full]}}\n"
        "  - label: typo\n    overrides: [seed=2, 'eval.benchmarks=[medqa_4options]']\n"
    )
    rc, _, err = cli("grid", str(runs), f"output_dir={tmp_path / 'out'}")
    assert rc == 2
    assert (
        f"{runs} run typo: eval.benchmarks[0]: unknown benchmark 'medqa_4options'; did you "
        "mean 'medqa'" in err
    )
    assert not (tmp_path / "out").exists(), "not even the first, good run may start"


def test_launch_lists_each_cells_problems_and_submits_nothing(tmp_path: Path, cli) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        f"base: {(CONFIGS / 'demo-quick.yaml').as_posix()}\nname: t\ngrid:\n"
        "  datasets: {demo: {}}\n  models: {tiny: {}}\n"
        "  methods:\n    full: {overrides: [selection.method=full]}\n"
        "    mine: {overrides: [selection.method=no-such-selector]}\n"
        "    cl: {overrides: [selection.method=cluster, allocation.method=cluster-interleave],"
        " ratios: [0.5, 50]}\n"
        "  world_sizes: [1]\n  seeds: [1]\n"
    )
    out = tmp_path / "out"
    rc, out_text, err = cli("launch", str(grid), "--dry-run", "--results", str(out))
    assert rc == 2, err[-2000:]
    assert "Preflight: 2 of 4 cells to run have problems; a launch refuses to submit" in out_text
    assert (
        "  error  cell demo.tiny.mine.ws1.s1: selection.method: unknown selector "
        "'no-such-selector'" in out_text
    )
    assert (
        "  error  cell demo.tiny.cl-r0.5.ws1.s1: selection.params.ratio: 0.5 looks like a "
        "fraction; it is a percentage (0-100, unlike selection.fraction's 0-1 share), did you "
        "mean 50?" in out_text
    )
    assert "demo.tiny.full.ws1.s1" in out_text.split("Preflight:")[0]  # the plan is still shown
    rc, _, err = cli("launch", str(grid), "--cluster", "local", "--results", str(out))
    assert rc == 2
    assert "2 of 4 cells to run have problems; nothing was submitted" in err
    assert "cell demo.tiny.mine.ws1.s1: selection.method" in err
    assert not out.exists(), "nothing may be submitted, not even the good cells"
