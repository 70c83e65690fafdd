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
from repro.core.config.builder import ConfigError
from repro.core.config.load import load_config
from repro.preflight import preflight
from repro.problems import Problem, report
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
        f"base: {Path(QUICK).as_posix()}\nname: t\ngrid:\n"
        "  datasets: {demo: {}}\n  models: {tiny: {}}\n"
        "  methods:\n    full: {overrides: [selection.method=full]}\n"
        f"  world_sizes: [1]\n  seeds: {seeds}\n{extra}"
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
        (["bench", "cluster", "--ks", "4,0"], "--ks", "comma-separated integers, each >= 1"),
        (["bench", "cluster", "--modes", "exact,slow"], "--modes", "a comma-separated list of exact, fast"),
        (["bench", "ddp", "--steps", "0"], "--steps", "an integer >= 1"),
        (["bench", "ddp", "--world-sizes", "1,0"], "--world-sizes", "comma-separated integers, each >= 1"),
        (
            ["bench", "stragglers", "--ratios", "50,101"],
            "--ratios",
            "comma-separated integers, each in [1, 100]",
        ),
        (["bench", "balance", "--ratio", "0"], "--ratio", "a finite number in (0, 100]"),
        (["bench", "k-scaling", "--no-real", "--cs", "0"], "--cs", "comma-separated integers, each >= 1"),
        (
            ["bench", "k-scaling", "--pools", "code,dental"],
            "--pools",
            "a comma-separated list of code, medical",
        ),
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


# ----------------------------------------------------------------------------- output_dir


def test_an_output_dir_that_is_a_file_is_refused_alike_by_validate_run_dry_run_and_launch(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    grid = _grid(tmp_path)
    line = f"output_dir: {str(afile)!r} is a file, not a folder"

    rc, out, _ = cli("launch", str(grid), "--dry-run", "--results", str(afile))
    assert rc == 2 and line in out, out[-2000:]
    assert "passed every check" not in out
    rc, _, err = cli("launch", str(grid), "--cluster", "local", "--results", str(afile))
    assert rc == 2 and line in err and "nothing was submitted" in err, err[-2000:]
    for cmd in (["validate", QUICK, "--quiet"], ["run", QUICK]):
        rc, _, err = cli(*cmd, f"output_dir={afile}")
        assert rc == 2 and line in err, err[-2000:]
    monkeypatch.chdir(tmp_path)  # relative: resolved against the current folder before the check
    rc, _, err = cli("validate", QUICK, "--quiet", "output_dir=afile")
    assert rc == 2 and line in err, err
    rc, _, err = cli("validate", QUICK, "--quiet", "output_dir=afile/runs")
    assert rc == 2 and f"output_dir: {str(afile / 'runs')!r}: {str(afile)!r} is a file, not a folder" in err
    assert afile.read_text() == "not a folder\n"
    rc, out, _ = cli("validate", QUICK, "--quiet", f"output_dir={tmp_path / 'new' / 'runs'}")
    assert rc == 0 and out.startswith("config_hash: ")  # a folder that can be made is fine
    assert not (tmp_path / "new").exists(), "a check makes nothing"


def test_a_dry_run_says_what_the_launch_would_still_need(tmp_path: Path, cli) -> None:
    """A dry run plans with the default profile on any machine; what stops the real launch then
    (no --profile for --cluster slurm) is said as a note, with the same words."""
    grid = _grid(tmp_path)
    rc, out, _ = cli("launch", str(grid), "--dry-run", "--results", str(tmp_path / "o"))
    assert rc == 0, out[-2000:]
    assert "  note   --cluster slurm needs --profile PROFILE.yaml" in out
    rc, _, err = cli("launch", str(grid), "--results", str(tmp_path / "o"))
    assert rc == 2 and "config error: --cluster slurm needs --profile PROFILE.yaml" in err
    rc, out, _ = cli("launch", str(grid), "--dry-run", "--cluster", "local", "--results", str(tmp_path / "o"))
    assert rc == 0 and "needs --profile" not in out


# ----------------------------------------------------------------------------- model paths


def test_a_revision_of_a_local_model_dir_is_refused_relative_or_absolute(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    said = "model.revision: 'main' pins a hub model, but model.name_or_path"
    for name in ("models/tiny", str(tmp_path / "models" / "tiny")):
        with pytest.raises(ConfigError, match=said):
            load_config(QUICK, [f"model.name_or_path={name}", "model.revision=main"])
        rc, _, err = cli("validate", QUICK, "--quiet", f"model.name_or_path={name}", "model.revision=main")
        assert rc == 2 and said in err, err
        args = ("--results", str(tmp_path / "o"), f"model.name_or_path={name}", "model.revision=main")
        rc, _, err = cli("launch", str(_grid(tmp_path)), "--dry-run", *args)
        assert rc == 2 and said in err, err
        rc, _, err = cli("launch", str(_grid(tmp_path)), "--cluster", "local", *args)
        assert rc == 2 and said in err, err
    # a hub id (no such folder here) keeps its revision
    assert (
        load_config(QUICK, ["model.name_or_path=owner/model", "model.revision=main"]).model.revision == "main"
    )


def test_a_local_model_dir_that_cannot_load_is_named_before_any_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models" / "empty").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)

    def said(name: str) -> list[str]:
        return [
            e for e in _errors(preflight(load_config(QUICK, [f"model.name_or_path={name}"]))) if "model" in e
        ]

    empty = str(tmp_path / "models" / "empty")
    assert (
        said("models/empty")
        == said(empty)
        == [
            f"model.name_or_path: {empty!r} has no config.json: expected a Hugging Face model folder "
            "(config.json, weights, tokenizer), a hub id (owner/name) or a builtin "
            "(tiny-random-llama, smollm2-135m-instruct)"
        ]
    )
    missing = str(tmp_path / "models" / "none")
    assert (
        said("./models/none")
        == said(missing)
        == [
            f"model.name_or_path: {missing!r} not found (a local model folder: absolute, or relative to "
            "the current folder); expected a Hugging Face model folder (config.json, weights, "
            "tokenizer), a hub id (owner/name) or a builtin (tiny-random-llama, smollm2-135m-instruct)"
        ]
    )
    assert said("owner/model") == []  # a hub id: fetched (and checked) by the model stage


def test_data_files_under_a_relative_or_absolute_data_dir_are_checked_and_named_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "ok.jsonl").write_text('{"instruction": "Say hi.", "output": "hi"}\n')
    monkeypatch.chdir(tmp_path)

    def said(data_dir: str, path: str) -> list[str]:
        cfg = load_config(QUICK, [f"data_dir={data_dir}", f"data.sources=[{{path: {path}, format: alpaca}}]"])
        return [e for e in _errors(preflight(cfg)) if e.startswith("data.sources")]

    assert said("d", "ok.jsonl") == said(str(tmp_path / "d"), "ok.jsonl") == []
    assert (
        said("d", "no.jsonl")
        == said(str(tmp_path / "d"), "no.jsonl")
        == [
            f"data.sources[0].path: file '{tmp_path / 'd' / 'no.jsonl'}' not found ('no.jsonl' relative to "
            "the data directory from data_dir)"
        ]
    )


# ----------------------------------------------------------------------------- feature shards


def test_more_feature_shards_than_the_pool_has_batches_is_refused_before_any_stage(cli) -> None:
    def errors(*overrides: str) -> list[str]:
        cfg = load_config(QUICK, ["selection.method=cluster", *overrides])
        return [e for e in _errors(preflight(cfg)) if "feature_shards" in e]

    assert errors("selection.params.feature_shards=96") == [
        "selection.params.feature_shards: 96 shards, but the feature pass has at most 12 batches "
        "(at most 96 pool rows from data.sources, selection.params.feature_batch_size 8); use at "
        "most 12"
    ]
    assert errors("selection.params.feature_shards=13") and not errors("selection.params.feature_shards=12")
    assert not errors("selection.params.feature_shards=24", "selection.params.feature_batch_size=4")
    assert errors("selection.params.feature_shards=12", "selection.params.feature_batch_size=9")
    rc, _, err = cli("validate", QUICK, "selection.method=cluster", "selection.params.feature_shards=96")
    assert rc == 2 and "selection.params.feature_shards: 96 shards" in err


def test_too_many_feature_shards_for_a_file_pool_is_a_clear_error_at_select(tmp_path: Path, cli) -> None:
    """A file pool without a `limit`: its size is known only to the pool stage; the error then names
    the key, the pool and the fix, and never blames the selector's code."""
    rows = [{"instruction": f"Say {i}.", "output": f"{i} " * (1 + i % 5)} for i in range(20)]
    (tmp_path / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, _, err = cli(
        "select",
        QUICK,
        f"output_dir={tmp_path / 'runs'}",
        f"data_dir={tmp_path}",
        "data.sources=[{path: pool.jsonl, format: alpaca}]",
        "data.heldout_fraction=0",
        "selection.method=cluster",
        "selection.params.feature_shards=5",
        "launch.torch_threads=1",
    )
    assert rc == 2, err[-3000:]
    assert re.search(
        r"selection\.params\.feature_shards = 5 is more than the pass's 3 batches \(N = 20\b", err
    ), err[-3000:]
    assert "use at most 3" in err
    assert "selector's code" not in err


# ----------------------------------------------------------------------------- the debug backend


RAN: list[str] = []


def _fails(what: str) -> None:
    from repro.core.prompts import DataError

    RAN.append(what)
    raise DataError(f"{what}: line 2: not JSON")


def _adds(a: int, b: int) -> int:
    return a + b


def test_a_failing_debug_job_is_an_error_never_a_debugger_prompt(tmp_path: Path) -> None:
    """submitit's DebugJob enters pdb.post_mortem on any exception; under pytest that reads the
    captured stdin and fails, in a terminal it waits at a (Pdb) prompt."""
    from repro.core.prompts import DataError
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
            "--results",
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


# ----------------------------------------------------------------------------- one line per problem


def test_the_same_problem_in_many_cells_is_one_line_with_the_cells_counted() -> None:
    missing = Problem("eval.benchmarks", "local data not found here: pubmedqa")
    five = {f"cell c{i}": [missing] for i in range(5)}
    assert report(five).splitlines() == [
        "  error  eval.benchmarks: local data not found here: pubmedqa (5 cells: c0, c1, c2 and 2 more)"
    ]
    two = {f"cell c{i}": [Problem("selection.n", f"cell c{i} keeps 3, too few")] for i in range(2)}
    assert report(two).splitlines() == ["  error  selection.n: this cell keeps 3, too few (2 cells: c0, c1)"]
    assert (
        report({"a.yaml": [missing]})
        == "  error  a.yaml: eval.benchmarks: local data not found here: pubmedqa"
    )
    note = Problem("data.sources[0].path", "hf:x: a hub dataset, not checked here", blocking=False)
    mixed = {"cell a": [note], "cell b": [note, missing], "cell c": [note]}
    assert report(mixed).splitlines() == [
        "  error  cell b: eval.benchmarks: local data not found here: pubmedqa",
        "  note   data.sources[0].path: hf:x: a hub dataset, not checked here (3 cells: a, b, c)",
    ]
    runs = {f"{d}/r.yaml run {x}": [missing] for d, x in (("/p", "a"), ("/p", "b"))}
    assert report(runs).splitlines() == [
        "  error  eval.benchmarks: local data not found here: pubmedqa (2 runs: /p/r.yaml run a, "
        "/p/r.yaml run b)"
    ]


def test_a_dry_run_prints_a_problem_of_every_cell_once(tmp_path: Path, cli) -> None:
    grid = _grid(tmp_path, seeds="[1, 2, 3, 4, 5]")
    args = ("--results", str(tmp_path / "o"), "eval.benchmarks=[pubmedqa]", f"data_dir={tmp_path}")
    rc, out, _ = cli("launch", str(grid), "--dry-run", *args)
    assert rc == 2
    errors = [x for x in out.splitlines() if x.startswith("  error")]
    assert len(errors) == 1, errors
    assert errors[0].startswith("  error  eval.benchmarks: local data not found here: pubmedqa")
    assert errors[0].endswith(
        "(5 cells: demo.tiny.full.ws1.s1, demo.tiny.full.ws1.s2, demo.tiny.full.ws1.s3 and 2 more)"
    )
    rc, _, err = cli("launch", str(grid), "--cluster", "local", *args)
    assert rc == 2 and [x for x in err.splitlines() if x.startswith("  error")] == errors
