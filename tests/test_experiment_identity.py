"""One experiment is one cell, and one cell is one run folder.

An experiment file (runs, grid, or both) that declares the same training config twice is refused
before anything runs, naming both declarations; an empty axis is refused naming its key instead
of becoming a default cell. Every shipped file plans the run folders (name and config hash) that
the separate planners of run lists and grid files planned before the one format
(tests/golden/experiment_run_folders.json), and `grid` runs the cells that `launch` submits.
Configs only, nothing trains."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from repro.cli import main
from repro.core.config.builder import ConfigError
from repro.experiments.experiment import load_experiment
from tests.conftest import CONFIGS

QUICK = (CONFIGS / "demo-quick.yaml").as_posix()
GRID_PART = """  datasets: {{demo: {{}}}}
  models: {{tiny: {{}}}}
  methods:
{methods}
  world_sizes: [2]
  seeds: [42]
"""


def _file(tmp_path: Path, text: str, name: str = "f.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _experiment(runs: str = "", methods: str = "") -> str:
    text = f"name: e\nbase: {QUICK}\noverrides: [world_size=2, seed=42]\n"
    if runs:
        text += "runs:\n" + runs
    if methods:
        text += "grid:\n" + GRID_PART.format(methods=methods)
    return text


def _refused(path: Path, *names: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_experiment(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: "), msg
    for n in names:
        assert n in msg, (n, msg)
    assert "same experiment" in msg and "remove one" in msg, msg
    return msg


def test_a_run_and_a_grid_cell_of_one_config_are_one_cell(tmp_path: Path, capsys) -> None:
    """A run `full` and a grid method `full` train the same config: one is refused, by name,
    by every command that takes the file, before anything runs."""
    path = _file(
        tmp_path,
        _experiment(
            runs="  - {label: full, overrides: [selection.method=full]}\n",
            methods="    full: {overrides: [selection.method=full]}\n"
            "    random: {overrides: [selection.method=random, selection.n=32]}\n",
        ),
    )
    msg = _refused(path, "runs[0] (full)", "grid cell demo.tiny.full.ws2.s42 (methods.full)")
    commands = (
        ["grid", str(path)],
        ["launch", str(path), "--dry-run", "--cluster", "local"],
        ["status", str(path)],
    )
    for cmd in commands:
        capsys.readouterr()
        assert main([*cmd, f"output_dir={tmp_path}/o"]) == 2
        assert msg in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing ran, nothing was planned to disk


def test_two_grid_methods_or_two_runs_of_one_config_are_refused(tmp_path: Path) -> None:
    grid = _file(
        tmp_path,
        _experiment(
            methods="    full: {overrides: [selection.method=full]}\n"
            "    all-data: {overrides: [selection.method=full]}\n"
        ),
    )
    _refused(grid, "grid cell demo.tiny.full.ws2.s42 (methods.full)", "demo.tiny.all-data.ws2.s42")
    # Names, paths and eval settings are not what trains: a run differing only there is the same.
    runs = _file(
        tmp_path,
        _experiment(
            runs="  - {label: a, overrides: [selection.method=full]}\n"
            "  - {label: b, overrides: [selection.method=full, eval.limit=3, name=other]}\n"
        ),
        "runs.yaml",
    )
    _refused(runs, "runs[0] (a)", "runs[1] (b)")
    # A command-line override (or --base) can make two runs one: refused as well.
    two = _file(
        tmp_path,
        f"base: {QUICK}\nruns:\n  - {{label: a, overrides: [selection.method=full]}}\n"
        "  - {label: b, overrides: [selection.method=random, selection.n=32]}\n",
        "two.yaml",
    )
    assert len(load_experiment(two).cells) == 2  # two experiments
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(two))}: runs\[0\] \(a\) and runs\[1\] \(b\)"):
        load_experiment(two, ["selection.method=full", "selection.n=null"])


def test_matched_cells_are_one_cell_when_config_and_reference_are(tmp_path: Path) -> None:
    """A matched cell's final config is known only once its reference has run: two are one cell
    when their configs before the match and their references (and how they match) are."""
    ref = "  - {label: c, overrides: [selection.method=cluster, selection.params.ratio=50]}\n"
    c2 = "  - {label: c2, overrides: [selection.method=cluster, selection.params.ratio=75]}\n"
    same = _file(
        tmp_path,
        _experiment(
            runs=ref
            + "  - {label: r1, match_kept_count_of: c, overrides: [selection.method=random]}\n"
            + "  - {label: r2, match_kept_count_of: c, overrides: [selection.method=random]}\n"
        ),
    )
    _refused(same, "runs[1] (r1)", "runs[2] (r2)", "matched to the same reference")
    # Another reference, or another way of matching, is another experiment.
    ok = _file(
        tmp_path,
        _experiment(
            runs=ref
            + c2
            + "  - {label: r1, match_kept_count_of: c, overrides: [selection.method=random]}\n"
            + "  - {label: r2, match_kept_count_of: c2, overrides: [selection.method=random]}\n"
            + "  - {label: r3, match_compute_of: c, overrides: [selection.method=random]}\n"
            + "  - {label: r4, overrides: [selection.method=random]}\n"
        ),
        "ok.yaml",
    )
    assert [c.id for c in load_experiment(ok).cells] == ["c", "c2", "r1", "r2", "r3", "r4"]
    # A grid's matched method repeated under another name: the same cells.
    grid = _file(
        tmp_path,
        _experiment(
            methods="    cluster: {overrides: [selection.method=cluster], ratios: [50]}\n"
            "    random: {overrides: [selection.method=random], match_kept_count_of: cluster}\n"
            "    random-again: {overrides: [selection.method=random], match_kept_count_of: cluster}\n"
        ),
        "g.yaml",
    )
    _refused(grid, "demo.tiny.random-r50.ws2.s42", "demo.tiny.random-again-r50.ws2.s42")
    # A run matched to a run that repeats a grid cell: the reference is refused first.
    both = _file(
        tmp_path,
        _experiment(
            runs=ref + "  - {label: r1, match_kept_count_of: c, overrides: [selection.method=random]}\n",
            methods="    cluster: {overrides: [selection.method=cluster], ratios: [50]}\n",
        ),
        "both.yaml",
    )
    _refused(both, "runs[0] (c)", "grid cell demo.tiny.cluster-r50.ws2.s42 (methods.cluster)")


@pytest.mark.parametrize(
    "old, new, key",
    [
        ("ratios: [50]", "ratios: []", "grid.methods.cluster.ratios"),
        ("ratios: [50]", "ratios: null", "grid.methods.cluster.ratios"),
        ("seeds: [42]", "seeds: []", "grid.seeds:"),
        ("world_sizes: [2]", "world_sizes: []", "grid.world_sizes:"),
        ("datasets: {demo: {}}", "datasets: {}", "grid.datasets:"),
        ("models: {tiny: {}}", "models: {}", "grid.models:"),
        (None, "methods: {}", "grid.methods:"),
    ],
)
def test_an_empty_axis_is_refused_naming_its_key(tmp_path: Path, old, new, key) -> None:
    text = _experiment(methods="    cluster: {overrides: [selection.method=cluster], ratios: [50]}\n")
    if old is None:  # the whole methods block
        text = re.sub(r"  methods:\n(    .*\n)+", f"  {new}\n", text)
    else:
        text = text.replace(old, new)
    assert new in text
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path))}.*{re.escape(key)}") as e:
        load_experiment(_file(tmp_path, text))
    assert "empty" in str(e.value) or "non-empty" in str(e.value)


def test_empty_runs_are_refused_and_empty_overrides_are_fine(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runs: expected a non-empty list of runs"):
        load_experiment(_file(tmp_path, _experiment() + "runs: []\n"))
    with pytest.raises(ConfigError, match=r"runs: expected a non-empty list of runs"):
        load_experiment(_file(tmp_path, f"base: {QUICK}\nruns: []\n", "rl.yaml"))
    ok = _file(
        tmp_path,
        f"base: {QUICK}\noverrides: []\nruns:\n  - {{label: a, overrides: []}}\n"
        "grid:\n"
        + GRID_PART.format(methods="    random: {set: {selection.method: random, selection.n: 32}}"),
        "ok.yaml",
    )
    assert [c.id for c in load_experiment(ok).cells] == ["demo.tiny.random.ws2.s42", "a"]


# ----------------------------------------------------------------------------- run identity

GOLDEN = Path(__file__).parent / "golden" / "experiment_run_folders.json"


def _planned(command: str, name: str, *flags: str) -> list[tuple[str, str]]:
    """(cell id, "name/config_hash") of every cell `cluster-repro COMMAND NAME FLAGS` plans."""
    from repro.cli import build_parser
    from repro.experiments.experiment import experiment_of

    _, cells = experiment_of(build_parser().parse_args([command, name, *flags]))
    return [(c.id, f"{cfg.name}/{cfg.hash()}") for c, cfg in ((c, c.check_config()) for c in cells)]


def test_shipped_files_plan_the_run_folders_of_the_earlier_planners() -> None:
    """Each shipped file (and the documented --base passes) plans, in order, the cells and run
    folders that the code before the one format planned: the grid files' planner (what `launch`
    ran) and the run lists' (what `grid` ran), computed by that code (the golden file). A change
    here moves finished runs to new folders: results already made would not be found. (Loading
    also refuses a file that declares one config twice.)"""
    import json

    golden = json.loads(GOLDEN.read_text())
    assert set(golden) >= {p.stem for p in (CONFIGS / "experiments").glob("*.yaml")}
    for key, folders in golden.items():
        name, *base = key.split(" --base ")
        flags = ["--base", base[0]] if base else []
        assert _planned("grid", f"experiments/{name}", *flags) == list(folders.items()), key


@pytest.mark.parametrize("name", ["demo-quick", "demo-seeds"])
def test_grid_runs_the_cells_that_launch_submits(tmp_path: Path, name: str) -> None:
    """The cells `grid` runs here and the jobs `launch` plans (its dry run's plan) from the same
    file and arguments: the same ids, the same configs (a matched cell's before its match)."""
    from repro.cli import build_parser
    from repro.core.config.load import from_dict
    from repro.experiments.experiment import experiment_of
    from slurm.launcher import load_context, plan_jobs
    from slurm.profile import ClusterProfile

    flags = ["--base", "demo-quick"] if name == "demo-seeds" else []
    args = build_parser().parse_args(["launch", f"experiments/{name}", "--results", str(tmp_path), *flags])
    jobs, done = plan_jobs(load_context(args, ClusterProfile()))
    assert not done
    submitted = [
        (j.name, from_dict(j.job.config).hash(), j.job.match_label) for j in jobs if j.kind == "cell"
    ]
    _, cells = experiment_of(build_parser().parse_args(["grid", f"experiments/{name}", *flags]))
    here = [(c.id, c.check_config().hash(), c.match_of) for c in cells]
    assert submitted == here
    assert any(match for _, _, match in here)  # matched cells are among them


# ----------------------------------------------------------------------------- the file's errors


@pytest.mark.parametrize(
    "text, expected",
    [
        ("name: x\n", r": an experiment file needs runs: \(labelled runs\) and/or grid: .*found keys: name$"),
        (
            "base: b.yaml\nrun:\n  - {label: a}\n",
            r": an experiment file needs runs: .* found keys: base, run$",
        ),
        (
            "base: b.yaml\nrunz: 1\nruns:\n  - {label: a}\n",
            r": unknown key 'runz'; did you mean 'runs'\? \(allowed: name, base, overrides, set, runs, grid, "
            r"estimate\)$",
        ),
        (
            "base: b.yaml\nruns:\n  - {label: a}\ndatasets: {demo: {}}\nseeds: [1]\n",
            r": datasets, seeds: axes of a grid; write them under the key grid:$",
        ),
        ("runs:\n  - {label: a}\n", r": base: required: the config file every run and cell starts from"),
        ("base: nope.yaml\nruns:\n  - {label: a}\n", r": base: config 'nope.yaml' not found \(looked at "),
        (
            "base: b.yaml\nruns:\n  - {label: a}\n  - {label: b}\n  - {label: a, overrides: [seed=3]}\n",
            r": runs\[0\] and runs\[2\] are both labelled 'a': a label names one run",
        ),
        (
            "base: b.yaml\nruns:\n  - {overrides: [seed=3]}\n",
            r": runs\[0\]: expected a mapping with a 'label'",
        ),
        (
            "base: b.yaml\nruns:\n  - {label: a, match_kept_count_of: b}\n  - {label: b}\n",
            r": runs\[0\] \(a\): match_kept_count_of: 'b' is not the label of an earlier run \(earlier "
            r"labels: none\)$",
        ),
        (
            "base: b.yaml\nruns:\n  - {label: a/b}\n",
            r": runs\[0\]\.label: 'a/b' is not allowed: it contains a path",
        ),
        (
            "base: b.yaml\nruns:\n  - {label: a, overides: [seed=3]}\n",
            r": runs\[0\]: unknown keys \['overides'\] \(allowed: label, overrides, set, match_kept_count_of",
        ),
        (
            "base: b.yaml\nruns:\n  - {label: a, overrides: seed=3}\n",
            r": runs\[0\]\.overrides: expected a list of 'key\.sub=value' strings, got 'seed=3'$",
        ),
        (
            "base: b.yaml\noverrides: [seed]\nruns:\n  - {label: a}\n",
            r": overrides: override 'seed': expected key\.sub=value",
        ),
        (
            "base: b.yaml\ngrid:\n  datasets: {demo: {}}\n  estimate: {}\n",
            r": grid: unknown keys \['estimate'\] \(allowed: datasets, models, methods, world_sizes, seeds, "
            r"exclude; name, base, overrides, set and estimate belong at the top of the file\)$",
        ),
        ("base: b.yaml\ngrid: [datasets]\n", r": grid: expected a mapping of axes \(datasets, models, "),
        ("base: b.yaml\nname: a/b\nruns:\n  - {label: a}\n", r": name: 'a/b' is not allowed"),
        (
            "base: b.yaml\nruns:\n  - {label: a}\nestimate: 0.79\n",
            r": estimate: expected a mapping of dry-run",
        ),
    ],
)
def test_a_bad_experiment_file_is_named_with_its_key_and_what_was_expected(
    tmp_path: Path, text: str, expected: str
) -> None:
    (tmp_path / "b.yaml").write_text(Path(QUICK).read_text())
    path = _file(tmp_path, text, "e.yaml")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}{expected}"):
        load_experiment(path)


def test_a_run_labelled_as_a_grid_cell_and_a_bad_base_are_refused(tmp_path: Path) -> None:
    text = _experiment(
        runs="  - {label: demo.tiny.full.ws2.s42, overrides: [selection.method=random, selection.n=8]}\n",
        methods="    full: {overrides: [selection.method=full]}\n",
    )
    path = _file(tmp_path, text)
    with pytest.raises(
        ConfigError, match=r"runs: the labels \['demo\.tiny\.full\.ws2\.s42'\] are also grid cell ids"
    ):
        load_experiment(path)
    with pytest.raises(ConfigError, match=r"--base 'nope' not found: no such file, nor a shipped config"):
        load_experiment(path, base="nope")
    with pytest.raises(
        ConfigError, match=r"^--base experiments/demo: .* is an experiment file; a base is one"
    ):
        load_experiment(path, base="experiments/demo")
