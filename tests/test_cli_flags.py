"""One flag name per idea across every command: the runs' store is `--results DIR`, an output is
`--out`, a list is one comma-separated value; `cluster-repro bench` is argparse sub-commands, and
each bench's --help shows its own flags only. The parsers are walked, so a new command is checked
as soon as it is registered."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

from repro.commands.bench import BENCHES, bench_parser
from tests.conftest import REPO

BENCH_MODULES = sorted(
    p.stem for p in (REPO / "repro" / "bench").glob("*.py") if "def add_arguments(" in p.read_text()
)
# Other names for the two ideas that have one: the store is --results, an output --out.
OTHER_NAMES = {"--output-dir", "--out-dir", "--runs-dir", "--features-dir", "--json", "--output"}


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from repro.cli import build_parser

    out = [("cluster-repro", build_parser())]
    out += [(f"cluster-repro bench {name}", bench_parser(name)) for name in BENCHES]
    for name in BENCH_MODULES:
        out.append((f"python -m repro.bench.{name}", importlib.import_module(f"repro.bench.{name}").parser()))
    return out


def _options(name: str, parser: argparse.ArgumentParser):
    """(command, action) of every option flag under `parser`, its sub-commands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, sp in action.choices.items():
                yield from _options(f"{name} {sub}", sp)
        elif action.option_strings:
            yield name, action


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")} - {"--help"}


def test_no_command_uses_another_name_or_a_space_separated_list() -> None:
    assert len(BENCH_MODULES) >= 12, BENCH_MODULES  # every bench module has add_arguments
    other, spaced, checked = [], [], 0
    for name, action in (x for n, p in _parsers() for x in _options(n, p)):
        checked += 1
        other += [f"{name} {s}" for s in action.option_strings if s in OTHER_NAMES]
        if action.nargs in ("+", "*") or isinstance(action.nargs, int) and action.nargs > 1:
            spaced.append(f"{name} {'/'.join(action.option_strings)}")
    assert other == [], "an output is --out, the runs' folder --results"
    assert spaced == [], "a list flag is one comma-separated value (repro/core/argtypes.py)"
    assert checked > 100


@pytest.mark.parametrize(
    "command, flag",
    [
        (["results"], "--results"),
        (["report"], "--results"),
        (["claims"], "--results"),
        (["launch"], "--results"),
        (["status"], "--results"),
        (["bench", "k-scaling"], "--results"),
        (["results"], "--out"),
        (["report"], "--out"),
        (["claims"], "--out"),
        (["eval"], "--out"),
        *((["bench", b], "--out") for b in BENCHES),
    ],
)
def test_the_store_is_results_and_an_output_is_out(command: list[str], flag: str) -> None:
    from repro.cli import build_parser

    if command[0] == "bench":
        parser = bench_parser(command[1])
    else:
        sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[command[0]]
    assert flag in _flags(parser)


def test_bench_help_lists_every_bench_with_one_line(capsys: pytest.CaptureFixture) -> None:
    from repro.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert list(BENCHES) == [
        "ddp",
        "features",
        "cluster",
        "paper-step",
        "stragglers",
        "balance",
        "k-scaling",
        "padding",
        "calibration",
    ]
    for name, (_, line) in BENCHES.items():
        assert re.search(rf"^\s+{re.escape(name)}\b", text, re.M), name
        assert " ".join(line.split()[:4]) in " ".join(text.split()), name
    # the benches' flags are theirs, not the group's
    assert not _flags_in(text) - {"--help"}, text


def _flags_in(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


@pytest.mark.parametrize("name", list(BENCHES))
def test_each_bench_help_shows_its_own_flags_only(name: str, capsys: pytest.CaptureFixture) -> None:
    from repro.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", name, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: cluster-repro bench {name} ")
    usage = text.split("\n\n")[0]  # the usage lines name every flag, and only the parser's own
    own = _flags(bench_parser(name))
    shown = _flags_in(usage) - {"--help"}
    hidden = {s for a in bench_parser(name)._actions if a.help == argparse.SUPPRESS for s in a.option_strings}
    assert shown == own - hidden, shown ^ (own - hidden)
    # and `python -m repro.bench.X` is the same parser
    module = importlib.import_module(BENCHES[name][0])
    assert _flags(module.parser()) == own


def test_a_bench_runs_through_its_subcommand(tmp_path, capsys: pytest.CaptureFixture) -> None:
    from repro.cli import main

    out = tmp_path / "rows.json"
    argv = ["bench", "cluster", "--n", "60", "--d", "8", "--ks", "2,3", "--modes", "fast"]
    assert main([*argv, "--growth", "", "--out", str(out)]) == 0
    import json

    rows = json.loads(out.read_text())
    assert [(r["k"], r["mode"]) for r in rows] == [(2, "fast"), (3, "fast")]
    assert "fast" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, said",
    [
        (["bench", "balance", "--output-dir", "x"], "unrecognized arguments: --output-dir"),
        (["bench", "cluster", "--ks", "4", "8"], "a list is one comma-separated value, e.g. --ks 4,8,16"),
    ],
)
def test_an_unknown_flag_or_a_spaced_list_is_refused(
    argv: list[str], said: str, capsys: pytest.CaptureFixture
) -> None:
    from repro.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and said in err, err
