"""Every check is one check: `validate`, `launch --dry-run` and the real command refuse the same
inputs with the same message; relative and absolute paths are checked alike; every numeric flag
of every command is range-checked by its parser; a failing job of the debug backend is an error,
never a debugger prompt; and a problem shared by many cells is printed once, the cells counted."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repro.core.argtypes import IntListType, NumberType
from repro.preflight import Problem
from tests.conftest import CONFIGS, REPO

QUICK = str(CONFIGS / "demo-quick.yaml")
BENCH_MODULES = sorted(
    p.stem for p in (REPO / "repro" / "bench").glob("*.py") if "def main(" in p.read_text()
)


def _errors(problems: list[Problem]) -> list[str]:
    return [str(p) for p in problems if p.blocking]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture):
    """`cluster-repro ARGS` in this process -> (exit code, stdout, stderr)."""
    from repro.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        rc = main(list(args))
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def _grid(tmp_path: Path, seeds: str = "[1, 2]", extra: str = "") -> Path:
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        f"base: {Path(QUICK).as_posix()}\nname: t\n"
        "datasets: {demo: {}}\nmodels: {tiny: {}}\n"
        "methods:\n  full: {overrides: [selection.method=full]}\n"
        f"world_sizes: [1]\nseeds: {seeds}\n{extra}"
    )
    return grid


# ----------------------------------------------------------------------------- numeric flags


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from repro.cli import build_parser

    out = [("cluster-repro", build_parser())]
    for name in BENCH_MODULES:
        out.append((f"python -m repro.bench.{name}", importlib.import_module(f"repro.bench.{name}").parser()))
    return out


def _actions(name: str, parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, sp in action.choices.items():
                yield from _actions(f"{name} {sub}", sp)
        else:
            yield name, action


NUMBERS = re.compile(r"-?\d+(\.\d+)?(,-?\d+(\.\d+)?)*")


def test_every_numeric_flag_of_every_command_is_range_checked_by_its_parser() -> None:
    assert len(BENCH_MODULES) >= 10, BENCH_MODULES  # the benches with a command line of their own
    bare, ranged = [], 0
    for name, action in (a for n, p in _parsers() for a in _actions(n, p)):
        flag = f"{name} {'/'.join(action.option_strings) or action.dest}"
        if action.type in (int, float):
            bare.append(flag)
        elif action.type is None and isinstance(action.default, str) and NUMBERS.fullmatch(action.default):
            bare.append(f"{flag} (numbers in a string)")
        ranged += isinstance(action.type, (NumberType, IntListType))
    assert bare == [], "flags without a range type (repro/core/argtypes.py)"
    assert ranged >= 40


@pytest.mark.parametrize(
    "argv, flag, expected",
    [
        (["bench", "cluster", "--n", "0"], "--n", "an integer >= 1"),
        (["bench", "cluster", "--d", "0"], "--d", "an integer >= 2"),
        (["bench", "cluster", "--ks", "4", "0"], "--ks", "an integer >= 1"),
        (["bench", "ddp", "--steps", "0"], "--steps", "an integer >= 1"),
        (["bench", "ddp", "--world-sizes", "1,0"], "--world-sizes", "comma-separated integers, each >= 1"),
        (
            ["bench", "stragglers", "--ratios", "50,101"],
            "--ratios",
            "comma-separated integers, each in [1, 100]",
        ),
        (["bench", "balance", "--ratio", "0"], "--ratio", "a finite number in (0, 100]"),
        (["bench", "k-scaling", "--no-real", "--cs", "0"], "--cs", "an integer >= 1"),
        (["bench", "paper-step", "--shape", "llama-2-7b", "--steps", "1"], "--steps", "an integer >= 2"),
        (["eval", "--model", "tiny-random-llama", "--limit", "0"], "--limit", "an integer >= 1"),
        (["eval", "--model", "tiny-random-llama", "--batch-size", "-1"], "--batch-size", "an integer >= 1"),
        (["eval", "--model", "tiny-random-llama", "--threads", "0"], "--threads", "an integer >= 1"),
        (
            ["eval", "--model", "tiny-random-llama", "--max-gen-toks", "x"],
            "--max-gen-toks",
            "an integer >= 1",
        ),
    ],
)
def test_a_flag_out_of_range_names_the_flag_and_the_range(argv, flag, expected, capsys) -> None:
    from repro.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"argument {flag}: expected {expected}" in err, err
    assert "please report it" not in err


def test_bench_cluster_flags_that_contradict_each_other_are_named(capsys) -> None:
    from repro.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "cluster", "--n", "3", "--ks", "4"])
    assert e.value.code == 2
    assert "--n 3: fewer rows than the --ks 4 clusters" in capsys.readouterr().err


def test_a_bench_module_run_as_a_script_checks_its_flags_too() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "repro.bench.cluster", "--n", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "argument --n: expected an integer >= 1, got '0'" in p.stderr
    assert "Traceback" not in p.stderr


# ----------------------------------------------------------------------------- the debug backend


RAN: list[str] = []


def _fails(what: str) -> None:
    from repro.core.data import DataError

    RAN.append(what)
    raise DataError(f"{what}: line 2: not JSON")


def _adds(a: int, b: int) -> int:
    return a + b


def test_a_failing_debug_job_is_an_error_never_a_debugger_prompt(tmp_path: Path) -> None:
    """submitit's DebugJob enters pdb.post_mortem on any exception; under pytest that reads the
    captured stdin and fails, in a terminal it waits at a (Pdb) prompt."""
    from repro.core.data import DataError
    from slurm.executors import make_executor
    from slurm.profile import ClusterProfile

    ex = make_executor("debug", tmp_path, ClusterProfile(), 1, "t")
    RAN.clear()
    job = ex.submit(_fails, "pool.jsonl")
    assert job.done()
    assert isinstance(job.exception(), DataError)
    with pytest.raises(DataError, match="pool.jsonl: line 2: not JSON"):
        job.result()
    with pytest.raises(DataError):
        job.results()
    assert RAN == ["pool.jsonl"], "the job ran once; its error is kept, not made again"
    assert job.state == "FAILED"
    ok = ex.submit(_adds, 1, 2)
    assert ok.result() == 3 and ok.done() and ok.exception() is None and ok.state == "DONE"


def test_launch_with_the_debug_backend_reports_a_failed_cell_and_exits_1(tmp_path: Path) -> None:
    good = {"instruction": "Say hi.", "output": "hi"}
    (tmp_path / "pool.jsonl").write_text(json.dumps(good) + "\n{not json\n")
    grid = _grid(
        tmp_path,
        seeds="[1]",
        extra="overrides: ['data.sources=[{path: pool.jsonl, format: alpaca}]', "
        f"'data_dir={tmp_path}', 'launch.torch_threads=1']\n",
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "launch",
            str(grid),
            "--cluster",
            "debug",
            "--output-dir",
            str(tmp_path / "o"),
        ],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = p.stdout + p.stderr
    assert "(Pdb)" not in text, text[-3000:]
    assert p.returncode == 1, text[-3000:]
    assert re.search(r"demo\.tiny\.full\.ws1\.s1: failed: DataError: .*pool\.jsonl.*line 2", p.stdout), text[
        -3000:
    ]
    assert "please report it" not in text
