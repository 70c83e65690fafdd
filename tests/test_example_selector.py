"""An outside selector, installed as a real package, runs through the whole pipeline (issue 4).

The example package under examples/ is installed with pip (into a temporary target folder, so the
test environment is not changed for later tests) and used by a fresh `python -m repro` process
that finds it only through its entry point: no change to this repository. The README's "Compare your
selection method" code is extracted and run the same way a reader would use it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from repro.core.io import read_json, read_jsonl
from repro.core.results import PART_NAME
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "cluster-repro-example-selector"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install --no-deps` of the example package into a fresh folder; returns that folder."""
    work = tmp_path_factory.mktemp("example-pkg")
    src = work / "src"
    shutil.copytree(EXAMPLE, src)  # pip's build writes build/ and *.egg-info next to the sources
    target = work / "site"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "--target",
            str(target),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert list(target.glob("cluster_repro_example_selector-0.1.0.dist-info"))
    return target


def _env(site: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "CLUSTER_REPRO_NO_PROGRESS": "1",
    }


def test_the_installed_package_runs_through_the_whole_pipeline(installed: Path, tmp_path: Path) -> None:
    env = _env(installed)
    ls = subprocess.run(
        [sys.executable, "-m", "repro", "ls", "selectors"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ls.returncode == 0, ls.stderr[-2000:]
    line = next(x for x in ls.stdout.splitlines() if x.startswith("longest-response"))
    assert "entry point of cluster-repro-example-selector" in line

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "run",
            "configs/demo-quick.yaml",
            f"output_dir={tmp_path}",
            "selection.method=longest-response",
            "selection.n=24",
            "selection.params.unit=words",
            "data.sources=[{path: demo, params: {train_size: 48, heldout_per_category: 1}}]",
            "train.epochs=1",
            "world_size=2",
            "train.global_batch_size=4",
            "eval.max_new_tokens=4",
            "launch.torch_threads=1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    part = Path(run.stdout.strip().splitlines()[-1])
    assert part.name == PART_NAME and part.is_file()
    run_dir = part.parent
    rows = list(csv.DictReader(open(part, newline="")))
    assert rows and {r["method"] for r in rows} == {"longest-response"}
    assert {r["n_selected"] for r in rows} == {"24"}
    assert {"heldout", "demo/overall"} <= {r["benchmark"] for r in rows}
    # What it kept: exactly the 24 longest responses (in words) of the run's pool.
    pool = read_jsonl(run_dir / "pool.jsonl")
    lengths = sorted((-len(r["response"].split()), k) for k, r in enumerate(pool))
    expected = {pool[k]["id"] for _, k in lengths[:24]}
    assert set(read_json(run_dir / "selection.json")["ids"]) == expected
    trained = {row.split(",")[0] for row in (run_dir / "selection.csv").read_text().splitlines()[1:]}
    assert trained == expected


def _readme_section() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^## Compare your selection method\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, "README.md has no '## Compare your selection method' section"
    return m.group(1)


def test_the_readme_selector_code_runs(tmp_path: Path) -> None:
    """The README's Python block, saved as a module a user would write, selects through the
    pipeline by `module:Class`; its TOML block is the entry-point table the example package uses."""
    section = _readme_section()
    py = re.findall(r"```python\n(.*?)```", section, re.S)
    toml_blocks = re.findall(r"```toml\n(.*?)```", section, re.S)
    assert len(py) == 1 and len(toml_blocks) == 1
    toml = tomllib.loads(toml_blocks[0])
    assert "cluster_repro.selectors" in toml["project"]["entry-points"]
    ours = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    assert "cluster_repro.selectors" in ours["project"]["entry-points"]

    (tmp_path / "my_selectors.py").write_text(py[0])
    cmds = re.findall(r"^cluster-repro (select .*)$", section, re.M)
    assert cmds, "the section shows how to run the selector"
    args = cmds[0].split() + [
        f"output_dir={tmp_path / 'runs'}",
        "data.sources=[{path: demo, params: {train_size: 48, heldout_per_category: 1}}]",
        "model.name_or_path=tiny-random-llama",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "CLUSTER_REPRO_NO_PROGRESS": "1",
    }
    p = subprocess.run(
        [sys.executable, "-m", "repro", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = Path(p.stdout.strip().splitlines()[-1]).parent
    sel = read_json(run_dir / "selection.json")
    pool = read_jsonl(run_dir / "pool.jsonl")
    assert 0 < len(sel["ids"]) < len(pool) and len(set(sel["ids"])) == len(sel["ids"])
    assert json.dumps(sel["info"])  # its summary reached selection.json
