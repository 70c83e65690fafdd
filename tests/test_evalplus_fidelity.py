"""EvalPlus's own rules under both protocols (evals/evalplus/compare.py, evals/evalplus/check.py):

- the comparator: MBPP+'s "is not None" tasks (Mbpp/737, 787, 794, whose canonical solutions
  return an re.Match) pass the canonical solution and fail `return None`, through the comparator
  itself, the lm-eval protocol's scoring of a local MBPP+ row and the evalplus protocol's check;
- time limits from the reference's time measured in the same evaluation: the oracle's verdicts on
  a heavy task (Mbpp/599, summing up to 10^7) are the same with a CPU hog running beside it;
- a reference that never finishes marks its task `reference_timeout`, left out of the score with
  a note, never the model's timeout, under both protocols;
- MBPP+'s version: every code row records its data file (name, version, tasks, sha256), and
  eval.evalplus_version selects the file (v0.2.0's missing file is named in the `missing` row,
  another version's file is refused by preflight, MBPP_OVERRIDE_PATH names the file instead).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evals import local_data
from evals.benchmarks import EvalSettings
from evals.entries import entries_to_rows
from evals.evalplus import data as evalplus_data
from evals.evalplus.check import check_solution, clear_reference_timings
from evals.evalplus.compare import Comparator, expected_outputs
from evals.harness import make_oracle_lm
from evals.run import run_benchmarks
from evals.task_functions import mbpp_process_results
from repro.core.config.load import from_dict
from repro.preflight import preflight
from repro.problems import CheckContext

NOT_NONE_TASKS = ("Mbpp/737", "Mbpp/787", "Mbpp/794")
PROTOCOLS = ("lm-eval", "evalplus")


def _rows(shared_data: Path) -> dict[str, dict]:
    return {r["task_id"]: r for r in local_data._read_jsonl(shared_data / "evalplus" / "MbppPlus.jsonl")}


def _data_dir(tmp_path: Path, rows: list[dict]) -> Path:
    """A data directory whose MBPP+ file holds just `rows` (EvalPlus's release format)."""
    (tmp_path / "evalplus").mkdir(parents=True)
    path = tmp_path / "evalplus" / "MbppPlus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return tmp_path


def _none(entry: str) -> str:
    return f"def {entry}(*args):\n    return None\n"


@pytest.mark.parametrize("task_id", NOT_NONE_TASKS)
def test_the_comparator_passes_the_canonical_solution_of_the_not_none_tasks_and_fails_none(
    task_id: str, shared_data: Path
) -> None:
    row = _rows(shared_data)[task_id]
    entry, canonical = row["entry_point"], row["canonical_solution"]
    inputs = row["base_input"] + row["plus_input"]
    # The comparator itself: an re.Match is compared by "is not None", not by identity.
    ns: dict = {}
    exec(canonical, ns)
    outs = [ns[entry](*inp) for inp in inputs]
    expected = expected_outputs("mbpp", entry, outs)
    assert any(outs) and not all(outs)  # some inputs match, some do not
    for inp, out, exp in zip(inputs, outs, expected):
        Comparator("mbpp", entry, row["atol"]).check(out, exp, inp)
    with pytest.raises(AssertionError):
        for inp, exp in zip(inputs, expected):
            Comparator("mbpp", entry, row["atol"]).check(None, exp, inp)
    # The lm-eval protocol's scoring of the local MBPP+ row (its generated differential test).
    doc = next(d for d in local_data.load_mbpp_plus(str(shared_data))["test"] if d["task_id"] == task_id)
    assert mbpp_process_results(doc, [canonical]) == {"pass@1": 1.0}
    assert mbpp_process_results(doc, [_none(entry)]) == {"pass@1": 0.0}
    # The evalplus protocol's check, on EvalPlus's deserialized base and plus inputs.
    problem = next(
        p for p in evalplus_data.load("mbpp_plus", str(shared_data)).problems if p.task_id == task_id
    )
    inputs = list(problem.base_input or []) + list(problem.plus_input or [])
    assert check_solution(canonical, problem.reference, entry, inputs, 0.0, "mbpp").passed
    verdict = check_solution(_none(entry), problem.reference, entry, inputs, 0.0, "mbpp")
    assert verdict.status == "failed" and "not equal" in verdict.stderr_tail


def test_a_solution_that_measures_its_input_sees_it_built_as_the_references(shared_data: Path) -> None:
    """Mbpp/596 returns sys.getsizeof of its input list: the size depends on how the list was
    built, so the solution gets a deep copy of each input as the reference did (its canonical
    solution failed the lm-eval protocol's check on JSON lists otherwise; EvalPlus's own inputs
    there are tuples)."""
    row = _rows(shared_data)["Mbpp/596"]
    assert "getsizeof" in row["canonical_solution"]
    doc = next(d for d in local_data.load_mbpp_plus(str(shared_data))["test"] if d["task_id"] == "Mbpp/596")
    assert mbpp_process_results(doc, [row["canonical_solution"]]) == {"pass@1": 1.0}
    assert mbpp_process_results(doc, ["def tuple_size(t):\n    return 0\n"]) == {"pass@1": 0.0}


def _oracle_entry(data_dir: Path, protocol: str, kind: str = "canonical", **settings) -> dict:
    (entry,) = run_benchmarks(
        make_oracle_lm(kind),
        ["mbpp_plus"],
        EvalSettings(data_dir=str(data_dir), protocol={"mbpp_plus": protocol}, **settings),
    )
    assert entry["status"] == "ok", entry
    return entry


def test_the_oracles_verdicts_on_heavy_tasks_do_not_change_beside_a_cpu_hog(
    shared_data: Path, tmp_path: Path
) -> None:
    """Mbpp/599's reference sums range(1, n + 1), up to n = 10^7 here (seconds on a loaded
    machine); each input's limit is max(1 s, 4 x the reference's time measured in the same
    evaluation). With as many busy processes as cores started here, the reference and the
    solution slow down together and the verdicts stay."""
    rows = _rows(shared_data)
    heavy = dict(rows["Mbpp/599"], plus_input=[[10**6], [10**6 + 1], [10**7]])
    data_dir = _data_dir(tmp_path, [heavy, rows["Mbpp/737"], rows["Mbpp/2"]])
    idle = {p: _oracle_entry(data_dir, p) for p in PROTOCOLS}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(2, _cores()))]
    try:
        loaded = {p: _oracle_entry(data_dir, p) for p in PROTOCOLS}
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    for p in PROTOCOLS:
        assert (idle[p]["value"], idle[p]["oracle_failed_tasks"]) == (1.0, [])
        assert (loaded[p]["value"], loaded[p]["oracle_failed_tasks"]) == (1.0, []), p


def _cores() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_looping_reference_leaves_its_task_out_of_the_score(
    protocol: str, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTER_REPRO_REFERENCE_TIMEOUT", "3")
    loop = {
        **_rows(shared_data)["Mbpp/2"],
        "task_id": "Mbpp/9001",
        "entry_point": "spin",
        "prompt": '"""\nWrite a function that never returns.\nassert spin(1) == 1\n"""\n',
        "canonical_solution": "def spin(x):\n    while True:\n        pass\n",
        "base_input": [[1]],
        "plus_input": [[2]],
        "assertion": "assert spin(1) == 1",
    }
    data_dir = _data_dir(tmp_path, [_rows(shared_data)["Mbpp/2"], loop])
    for kind, value in (("canonical", 1.0), ("empty", 0.0)):
        entry = _oracle_entry(data_dir, protocol, kind)
        assert (entry["n"], entry["value"]) == (1, value)  # Mbpp/2 alone is scored
        assert entry["excluded_tasks"] == {"reference_timeout": ["Mbpp/9001"]}
        assert "Mbpp/9001" in entry["note"] and "did not finish in 3 s" in entry["note"]
        if kind == "canonical":
            assert entry["oracle_failed_tasks"] == []  # never the model's failure or timeout
        (row,) = entries_to_rows([entry], {"run_id": "r", "versions": "{}"})
        v = json.loads(row["versions"])
        assert v["eval_excluded_tasks"] == {"reference_timeout": ["Mbpp/9001"]} and v["eval_note"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_code_row_records_its_data_files_version_and_sha256(
    protocol: str, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MBPP_OVERRIDE_PATH", raising=False)
    path = shared_data / "evalplus" / "MbppPlus.jsonl"
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    entries = run_benchmarks(
        make_oracle_lm("canonical"),
        ["humaneval", "mbpp", "mbpp_plus"],
        EvalSettings(data_dir=str(shared_data), limit=1, protocol=dict.fromkeys(["mbpp_plus"], protocol)),
    )
    rows = {r["benchmark"]: json.loads(r["versions"]) for r in entries_to_rows(entries, {"versions": "{}"})}
    assert rows["mbpp_plus"]["eval_data_file"] == "MbppPlus.jsonl"
    assert (rows["mbpp_plus"]["eval_data_version"], rows["mbpp_plus"]["eval_data_tasks"]) == ("v0.1.x", 399)
    assert rows["mbpp_plus"]["eval_data_sha256"] == sha
    for b in ("humaneval", "mbpp"):  # the other code rows too
        assert len(rows[b]["eval_data_sha256"]) == 64 and rows[b]["eval_data_file"]
    # v0.2.0 selects its own file: missing here, so a `missing` row that names it.
    (missing,) = run_benchmarks(
        make_oracle_lm("canonical"),
        ["mbpp_plus"],
        EvalSettings(
            data_dir=str(shared_data), limit=1, protocol={"mbpp_plus": protocol}, evalplus_version="v0.2.0"
        ),
    )
    assert missing["status"] == "missing" and "MbppPlus-v0.2.0.jsonl" in missing["reason"]
    # Given (a file of 378 tasks under that name), it is read and recorded as v0.2.0.
    v2 = tmp_path / "v2"
    _data_dir(v2, local_data._read_jsonl(path)[:378])
    (v2 / "evalplus" / "MbppPlus.jsonl").rename(v2 / "evalplus" / "MbppPlus-v0.2.0.jsonl")
    entry = _oracle_entry(v2, protocol, limit=1, evalplus_version="v0.2.0")
    assert (entry["data"]["file"], entry["data"]["version"], entry["data"]["tasks"]) == (
        "MbppPlus-v0.2.0.jsonl",
        "v0.2.0",
        378,
    )
    # MBPP_OVERRIDE_PATH (EvalPlus's switch) names the file instead; its version must match.
    monkeypatch.setenv("MBPP_OVERRIDE_PATH", str(path))
    assert _oracle_entry(v2, protocol, limit=1)["data"]["sha256"] == sha
    with pytest.raises(ValueError, match="399 tasks, which is MBPP\\+ v0.1.x"):
        evalplus_data.code_data_info("mbpp_plus", str(v2), version="v0.2.0")


def test_preflight_names_an_unknown_version_and_another_versions_file(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def problems(version: str) -> list[str]:
        cfg = from_dict({}, [f"data_dir={shared_data}", f"eval.evalplus_version={version}"])
        return [p.message for p in preflight(cfg, CheckContext()) if p.key == "eval.evalplus_version"]

    monkeypatch.delenv("MBPP_OVERRIDE_PATH", raising=False)
    (unknown,) = problems("v0.3")
    assert "'v0.3'" in unknown and "v0.1.x, v0.2.0" in unknown
    assert problems("v0.1.x") == []  # the local file holds 399 tasks: v0.1.x
    assert problems("v0.2.0") == []  # its file is missing here: a note of check_benchmarks
    # A file of another version, named through EvalPlus's switch, is refused before training.
    monkeypatch.setenv("MBPP_OVERRIDE_PATH", str(shared_data / "evalplus" / "MbppPlus.jsonl"))
    (other,) = problems("v0.2.0")
    assert "399 tasks, which is MBPP+ v0.1.x" in other and "eval.evalplus_version is v0.2.0" in other


@pytest.fixture(autouse=True)
def _fresh_reference_times():
    """Each test measures its own reference times."""
    clear_reference_timings()
    yield
    clear_reference_timings()
