"""One experiment is one cell: an experiment file (runs, grid, or both) or a run list that
declares the same training config twice is refused before anything runs, naming both
declarations; an empty axis is refused naming its key instead of becoming a default cell.
Configs only, nothing trains."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from repro.cli import main
from repro.core.config.builder import ConfigError
from repro.experiments.experiment import load_experiment
from repro.experiments.grids import load_grid
from repro.experiments.runlists import load_run_list, preflight_run_list
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
    # The run-list path (`cluster-repro grid RUNLIST`) refuses it in its preflight, too.
    plain = _file(
        tmp_path,
        f"base: {QUICK}\nruns:\n  - {{label: a, overrides: [selection.method=full]}}\n"
        "  - {label: b, overrides: [selection.method=full]}\n",
        "plain.yaml",
    )
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(plain))}: runs\[0\] \(a\) and runs\[1\] \(b\)"):
        preflight_run_list(load_run_list(plain))
    # A command-line override can make two runs one: refused as well.
    two = _file(
        tmp_path,
        f"base: {QUICK}\nruns:\n  - {{label: a, overrides: [selection.method=full]}}\n"
        "  - {label: b, overrides: [selection.method=random, selection.n=32]}\n",
        "two.yaml",
    )
    preflight_run_list(load_run_list(two))  # two experiments
    with pytest.raises(ConfigError, match=r"runs\[0\] \(a\) and runs\[1\] \(b\)"):
        preflight_run_list(load_run_list(two), ["selection.method=full", "selection.n=null"])


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
        ("ratios: [50]", "ratios: []", "methods.cluster.ratios"),
        ("ratios: [50]", "ratios: null", "methods.cluster.ratios"),
        ("seeds: [42]", "seeds: []", "'seeds'"),
        ("world_sizes: [2]", "world_sizes: []", "'world_sizes'"),
        ("datasets: {demo: {}}", "datasets: {}", "'datasets'"),
        ("models: {tiny: {}}", "models: {}", "'models'"),
        (None, "methods: {}", "'methods'"),
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
    # The same file as a grid file of its own (its axes at the top level): the same refusal.
    flat = re.sub(r"^  ", "", text.replace("grid:\n", ""), flags=re.M)
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_grid(_file(tmp_path, flat, "flat.yaml"))


def test_empty_runs_are_refused_and_empty_overrides_are_fine(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runs: expected a non-empty list of runs"):
        load_experiment(_file(tmp_path, _experiment() + "runs: []\n"))
    with pytest.raises(ConfigError, match=r"runs: expected a non-empty list of runs"):
        load_run_list(_file(tmp_path, f"base: {QUICK}\nruns: []\n", "rl.yaml"))
    ok = _file(
        tmp_path,
        f"base: {QUICK}\noverrides: []\nruns:\n  - {{label: a, overrides: []}}\n"
        "grid:\n  set: {selection.method: random, selection.n: 32}\n"
        + GRID_PART.format(methods="    random: {overrides: []}"),
        "ok.yaml",
    )
    assert [c.id for c in load_experiment(ok).cells] == ["demo.tiny.random.ws2.s42", "a"]


def test_every_shipped_experiment_file_declares_each_experiment_once(tmp_path: Path) -> None:
    """The shipped run lists and grids load: none plans one config twice."""
    for path in sorted((CONFIGS / "grids").glob("*.yaml")) + sorted((CONFIGS / "runs").glob("*.yaml")):
        cells = load_experiment(path, [f"output_dir={tmp_path}"]).cells
        keys = [c.check_config().hash() for c in cells if c.match_of is None]
        assert len(keys) == len(set(keys)), path
