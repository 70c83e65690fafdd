"""Plugin benchmarks (evals/plugins.py, docs/add-a-benchmark.md) without a model: a task folder's
benchmark with its data missing gives the eight's loud `missing` row, what makes a folder or an
entry point unusable is said with its file or entry point, names and aliases, preflight, and the
reports' grouping by the kind the rows state. A real task's scores through a run, its rows and the
report's table, from a folder and from a pip-installed package: tests/test_byo_docs.py."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from evals.benchmarks import EvalSettings, expand_benchmarks, known_benchmarks
from evals.entries import entries_to_rows
from evals.plugins import BenchmarkPluginError, _entry_benchmark
from evals.run import run_benchmarks

TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D", "E"]
doc_to_target: answer_idx
{metrics}metadata:
  version: 1.0
  kind: {kind}
"""
METRICS = "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"


def _task(
    folder: Path,
    name: str = "medq5",
    data: str = "nowhere/medq5.jsonl",
    kind: str = "medical",
    metrics: str = METRICS,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(TASK.format(name=name, data=data, kind=kind, metrics=metrics))
    return path


def test_missing_data_gives_a_loud_missing_row_with_the_benchmark_kind(tmp_path, capsys):
    _task(tmp_path / "tasks", data=str(tmp_path / "absent.jsonl"))
    entries = run_benchmarks(
        object(), ["medq5"], EvalSettings(task_paths=[str(tmp_path / "tasks")]), tmp_path / "out"
    )
    assert [(e["benchmark"], e["status"], e["kind"]) for e in entries] == [("medq5", "missing", "medical")]
    assert "absent.jsonl" in entries[0]["reason"] and "dataset_kwargs.data_files" in entries[0]["reason"]
    assert "MISSING benchmark medq5" in capsys.readouterr().err
    (row,) = entries_to_rows(entries, {"run_id": "r", "versions": "{}"})
    assert row["metric"] == "missing" and row["value"] is None
    assert json.loads(row["versions"])["benchmark_kind"] == "medical"


def test_names_aliases_and_what_makes_a_folder_unusable(tmp_path, capsys):
    tasks = tmp_path / "tasks"
    _task(tasks)
    assert expand_benchmarks("medical,medq5", [str(tasks)]) == [
        "medqa",
        "medmcqa",
        "pubmedqa",
        "mmlu_medical",
        "medq5",
    ]  # aliases: the eight only
    with pytest.raises(ValueError, match="did you mean 'medq5'"):
        expand_benchmarks("medq55", [str(tasks)])
    with pytest.raises(ValueError, match="unknown benchmark 'medq5'"):
        expand_benchmarks("medq5")  # without the folder it is not known
    from repro.cli import main

    # `cluster-repro eval --task-path` knows the folder's benchmarks (checked before any model loads).
    assert (
        main(["eval", "--model", "tiny-random-llama", "--benchmarks", "medq55", "--task-path", str(tasks)])
        == 2
    )
    assert "unknown benchmark 'medq55'; did you mean 'medq5'?" in capsys.readouterr().err
    b = known_benchmarks([str(tasks)])["medq5"]
    assert (b.kind, b.metrics, b.task_name("local"), b.plugin) == ("medical", ("acc",), "medq5", True)

    cases = [  # (folder contents, what the message names)
        (lambda d: _task(d, metrics=""), r"medq5\.yaml: metric_list"),
        (lambda d: _task(d, kind="legal"), r"medq5\.yaml: metadata\.kind: kind 'legal'"),
        (
            lambda d: _task(d, name="medqa"),
            r"'medqa' \(eval\.task_paths: .*medqa\.yaml\) has the "
            r"name of a built-in",
        ),
        (lambda d: _task(d, name="medqa_local"), r"'medqa_local'.*name of a built-in"),
    ]
    for k, (make, message) in enumerate(cases):
        make(tmp_path / f"bad{k}")
        with pytest.raises(BenchmarkPluginError, match=message):
            known_benchmarks([str(tmp_path / f"bad{k}")])
    with pytest.raises(BenchmarkPluginError, match=r"'medq5' is defined twice"):
        known_benchmarks([str(tasks), str(tasks)])
    with pytest.raises(BenchmarkPluginError, match=r"eval\.task_paths\[0\] = 'nope': no such folder"):
        known_benchmarks(["nope"])


def test_preflight_knows_plugin_benchmarks(tmp_path):
    from repro.core.config.load import from_dict
    from repro.preflight import preflight

    tasks = str(_task(tmp_path / "tasks").parent)
    found = preflight(from_dict({}, [f"eval.task_paths=[{tasks}]", "eval.benchmarks=[medq55]"]))
    (p,) = [p for p in found if p.key.startswith("eval.")]
    assert p.blocking and "did you mean 'medq5'" in p.message
    found = preflight(from_dict({}, [f"eval.task_paths=[{tasks}]", "eval.benchmarks=[medq5]"]))
    (p,) = [p for p in found if p.key.startswith("eval.")]
    assert not p.blocking and "nowhere/medq5.jsonl" in p.message  # a note: a missing row later
    found = preflight(from_dict({}, ["eval.task_paths=[nope]", "eval.benchmarks=[medq5]"]))
    assert [(p.key, p.blocking) for p in found if p.key.startswith("eval.")] == [("eval.task_paths", True)]


# Entry-point objects for _entry_benchmark: real EntryPoint objects that load these names (the
# installed example package's own entry point is tests/test_byo_docs.py's).
GOOD = {"kind": "other", "task": "medq5", "metrics": ["acc"], "task_dir": None}
TYPO = {"kind": "medical", "task": "medq5", "metric": "acc", "taskdir": "x"}
NO_TASK_YAML = {"kind": "medical", "task": "nosuchtask", "metric": "acc"}


def _ep(attr: str) -> EntryPoint:
    return EntryPoint(name="my-bench", value=f"{__name__}:{attr}", group="cluster_repro.benchmarks")


def test_entry_points_are_checked_and_named(tmp_path):
    NO_TASK_YAML["task_dir"] = str(_task(tmp_path / "tasks").parent)
    b = _entry_benchmark(_ep("GOOD"))
    assert (b.name, b.kind, b.metrics, b.task_dir) == ("my-bench", "other", ("acc",), None)
    with pytest.raises(BenchmarkPluginError, match=r"entry point 'my-bench' .*unknown keys \['taskdir'\]"):
        _entry_benchmark(_ep("TYPO"))
    with pytest.raises(BenchmarkPluginError, match=r"no YAML in task_dir .* defines task 'nosuchtask'"):
        _entry_benchmark(_ep("NO_TASK_YAML"))
    with pytest.raises(BenchmarkPluginError, match=r"failed to load: AttributeError"):
        _entry_benchmark(_ep("NOT_THERE"))


def _score(model, tokenizer, heldout, max_new_tokens, batch_size, device="cpu", limit=None):
    return {}, []


HELDOUT = {"kind": "pool", "metric": "exact", "score": _score, "max_new_tokens": 16}
BOTH = {**HELDOUT, "task": "medq5"}
NO_LIMIT = {"kind": "pool", "metric": "exact", "score": _score}
POOL_TASK = {"kind": "pool", "task": "medq5", "metric": "acc"}


def test_a_benchmark_of_held_out_rows_is_checked_and_kept_out_of_lm_eval():
    """`score` instead of `task` (the demo's kind, repro/demo/tasks.py): its own generation limit
    is required, `pool` is a kind only it may state, and lm-eval never runs it."""
    b = _entry_benchmark(_ep("HELDOUT"))
    assert b.heldout and (b.kind, b.metrics, b.max_new_tokens, b.harness_task) == ("pool", ("exact",), 16, "")
    with pytest.raises(BenchmarkPluginError, match=r"give `task` \(an lm-eval task\) or `score`"):
        _entry_benchmark(_ep("BOTH"))
    with pytest.raises(BenchmarkPluginError, match=r"max_new_tokens: expected its own generation limit"):
        _entry_benchmark(_ep("NO_LIMIT"))
    with pytest.raises(BenchmarkPluginError, match=r"kind 'pool': expected one of code, medical, other"):
        _entry_benchmark(_ep("POOL_TASK"))
    with pytest.raises(ValueError, match=r"benchmark 'demo' scores the held-out rows of a run's pool"):
        run_benchmarks(object(), ["demo"], EvalSettings(), None)


def test_reports_group_a_benchmark_by_the_kind_its_rows_state():
    from reports.runs import domain_of

    # A benchmark of held-out rows: its categories are a group of their own, the pooled row none.
    kinds = {"demo/add": "pool", "demo/overall": "pool"}
    assert domain_of("demo/add", kinds) == "demo" and domain_of("demo/overall", kinds) is None
    assert domain_of("demo/add") is None  # the kind its rows state decides, not its name

    assert domain_of("medq5", {"medq5": "medical"}) == "medical"
    assert domain_of("medq5", {"medq5": "other"}) is None  # a column of its own, in no average
    assert domain_of("medq5") is None and domain_of("medqa") == "medical"
    assert domain_of("humaneval", {"humaneval": "medical"}) == "code"  # the paper's names first


def test_eval_of_a_run_knows_the_benchmarks_of_its_task_paths(tmp_path):
    """`cluster-repro eval --run RUN` reads RUN's eval.task_paths, so a run's plugin benchmark is
    known without repeating --task-path (a command-line folder adds to them, once)."""
    import argparse

    from evals.cli import _task_paths
    from repro.core.config.load import load_config, save_config

    tasks, more = tmp_path / "tasks", tmp_path / "more"
    _task(tasks)
    _task(more, name="medq6")
    run = tmp_path / "run"
    run.mkdir()
    save_config(load_config("configs/demo-quick.yaml", [f"eval.task_paths=[{tasks}]"]), run / "config.yaml")
    with pytest.raises(ValueError, match="medq5"):
        expand_benchmarks("medq5", [])
    paths = _task_paths(argparse.Namespace(run=str(run), task_path=[str(more), str(tasks)]))
    assert paths == [str(tasks), str(more)]
    assert expand_benchmarks("medq5,medq6", paths) == ["medq5", "medq6"]
    assert _task_paths(argparse.Namespace(run=None, task_path=[str(more)])) == [str(more)]
