"""Each local benchmark task, through the real lm-evaluation-harness, against an answer key read
independently from the raw data files.

The "model" is a scripted stand-in (an lm-eval `LM` subclass that looks up the answer key), since
no real model answers right every time: a right-answer model must score 1.0 and a wrong-answer
model 0.0, which checks the loaders' label mapping, that the prompt carries the question, the
metric, and (for code) the sandboxed scoring of the canonical solutions.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from evals import local_data
from evals.benchmarks import EvalSettings
from evals.entries import entries_to_rows
from evals.run import run_benchmarks

LIMIT = 4


class ScriptedLM:
    """Stand-in model: answers from `key` ({text found in the prompt: right answer}). The key
    entry found last in the prompt is the item's own (few-shot examples come first)."""

    def __new__(cls, *args, **kwargs):  # build the lm-eval subclass lazily (import cost)
        from lm_eval.api.model import LM

        class _Scripted(LM):
            def __init__(self, key: dict[str, str], kind: str, right: bool):
                super().__init__()
                self.key, self.kind, self.right = key, kind, right
                self.calls = 0

            def _answer(self, context: str) -> str:
                hits = [(context.rfind(k), v) for k, v in self.key.items() if k in context]
                if not hits:
                    raise AssertionError(f"no answer-key entry occurs in the prompt: {context[-300:]!r}")
                return max(hits)[1]

            def loglikelihood(self, requests):
                out = []
                for req in requests:
                    context, continuation = req.args
                    self.calls += 1
                    correct = continuation.strip() == self._answer(context)
                    out.append((0.0 if correct == self.right else -5.0, True))
                return out

            def generate_until(self, requests):
                out = []
                for req in requests:
                    self.calls += 1
                    code = self._answer(req.args[0])
                    out.append(code if self.right else self.kind)
                return out

            def loglikelihood_rolling(self, requests):
                raise NotImplementedError

        return _Scripted(*args, **kwargs)


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _key(bench: str, data: Path) -> dict[str, str]:
    """The answer key, straight from the raw files (not through evals.local_data)."""
    if bench in ("medqa", "medmcqa"):
        return {r["question"]: r["answer_idx"] for r in _jsonl(data / "medagents" / bench / "test.jsonl")}
    if bench == "pubmedqa":
        pqal = json.loads((data / "pubmedqa" / "ori_pqal.json").read_text())
        truth = json.loads((data / "pubmedqa" / "test_ground_truth.json").read_text())
        return {pqal[i]["QUESTION"]: label for i, label in truth.items()}
    if bench == "mmlu_medical":
        key = {
            r["question"].strip(): r["answer_idx"] for r in _jsonl(data / "medagents" / "mmlu" / "test.jsonl")
        }
        for s in local_data.MMLU_MEDICAL_SUBJECTS:  # dev rows appear only as shots
            with open(data / "mmlu_dev" / f"{s}_dev.csv", newline="") as fh:
                for rec in csv.reader(fh):
                    key.setdefault(rec[0], rec[5])
        return key
    if bench == "humaneval":
        return {r["prompt"]: r["canonical_solution"] for r in _jsonl(local_data.humaneval_file())}
    if bench == "mbpp":
        return {
            r["test_list"][0]: r["canonical_solution"] for r in _jsonl(data / "evalplus" / "MbppBase.jsonl")
        }
    if bench == "mbpp_plus":
        return {
            r["assertion"].strip().splitlines()[0].strip(): r["canonical_solution"]
            for r in _jsonl(data / "evalplus" / "MbppPlus.jsonl")
        }
    raise KeyError(bench)


WRONG_CODE = {
    "humaneval": "    raise NotImplementedError\n",
    "humaneval_plus": "    return 'no'\n",
    "mbpp": "pass\n",
    "mbpp_plus": "import sys\nsys.exit(0)\n",
}
LOCAL = ["medqa", "medmcqa", "pubmedqa", "mmlu_medical", "humaneval", "mbpp", "mbpp_plus"]


@pytest.mark.parametrize("bench", LOCAL)
def test_local_task_scores_right_model_1_and_wrong_model_0(bench, shared_data, tmp_path):
    key = _key(bench, shared_data)
    settings = EvalSettings(source="local", data_dir=str(shared_data), limit=LIMIT)
    for right, expected in ((True, 1.0), (False, 0.0)):
        lm = ScriptedLM(key, WRONG_CODE.get(bench, ""), right)
        entries = run_benchmarks(lm, [bench], settings, tmp_path / str(right))
        main = entries[0]
        assert main["status"] == "ok", main["reason"]
        assert main["benchmark"] == bench and main["value"] == expected, entries
        n_expected = LIMIT * (6 if bench == "mmlu_medical" else 1)
        assert main["n"] == n_expected and lm.calls > 0
        assert main["task_version"] == "1.0" and main["lm_eval_version"] == "0.4.13"
    samples = sorted((tmp_path / "False" / "samples").glob("*.jsonl"))
    assert samples, "per-sample logs were not written"
    assert len(_jsonl(samples[0])) == LIMIT


def test_local_data_loaders_read_every_row(shared_data):
    """Row counts of the full local copies (shared/data/README.md) and the label mapping."""
    assert len(local_data.load_medqa(shared_data)["test"]) == 1273
    assert len(local_data.load_medmcqa(shared_data)["validation"]) == 2816
    pub = local_data.load_pubmedqa(shared_data)["test"]
    assert len(pub) == 500 and set(pub["final_decision"]) == {"yes", "no", "maybe"}
    sizes = {
        s: len(local_data.load_mmlu(shared_data, subject=s)["test"]) for s in local_data.MMLU_MEDICAL_SUBJECTS
    }
    assert sum(sizes.values()) == 1089 and sizes["anatomy"] == 135
    assert len(local_data.load_mmlu(shared_data, subject="anatomy")["dev"]) == 5
    assert len(local_data.load_humaneval()["test"]) == 164
    assert len(local_data.load_mbpp(shared_data)["test"]) == 409
    assert len(local_data.load_mbpp_plus(shared_data)["test"]) == 399


def test_humaneval_plus_is_missing_loudly_without_a_user_file(shared_data, tmp_path, capsys):
    entries = run_benchmarks(
        ScriptedLM({}, "", True),
        ["humaneval_plus"],
        EvalSettings(data_dir=str(shared_data), limit=2),
        tmp_path,
    )
    assert [(e["benchmark"], e["status"], e["metric"], e["value"]) for e in entries] == [
        ("humaneval_plus", "missing", "missing", None)
    ]
    assert "no offline copy" in entries[0]["reason"]
    assert "MISSING benchmark humaneval_plus" in capsys.readouterr().err


def test_humaneval_plus_runs_from_a_user_supplied_evalplus_file(tmp_path):
    """An evalplus-release-format file (inputs, no test program): the test compares the
    candidate with the canonical solution on every input."""
    he = _jsonl(local_data.humaneval_file())[:2]
    inputs = {
        "HumanEval/0": [[[1.0, 2.0, 3.0], 0.5], [[1.0, 2.8, 3.0, 4.0], 0.3], [[], 1.0]],
        "HumanEval/1": [["(()()) ((())) () ((())()())"], ["() (()) ((())) (((())))"]],
    }
    (tmp_path / "evalplus").mkdir()
    with open(tmp_path / "evalplus" / "HumanEvalPlus.jsonl", "w") as fh:
        for r in he:
            fh.write(
                json.dumps(
                    {k: r[k] for k in ("task_id", "prompt", "entry_point", "canonical_solution")}
                    | {
                        "base_input": inputs[r["task_id"]][:1],
                        "plus_input": inputs[r["task_id"]][1:],
                        "atol": 0,
                    }
                )
                + "\n"
            )
    key = {r["prompt"]: r["canonical_solution"] for r in he}
    settings = EvalSettings(data_dir=str(tmp_path), limit=2)
    for right, expected in ((True, 1.0), (False, 0.0)):
        entries = run_benchmarks(
            ScriptedLM(key, WRONG_CODE["humaneval_plus"], right), ["humaneval_plus"], settings, None
        )
        assert entries[0]["status"] == "ok" and entries[0]["value"] == expected


def test_hub_and_local_variants_share_prompt_extraction_and_metric():
    """Every benchmark has a hub and a local task; their configs differ only in where the rows
    come from (the hub variants cannot be run here: no hub access)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    from evals.benchmarks import BENCHMARKS, TASKS_DIR

    source_keys = {
        "task",
        "dataset_path",
        "dataset_name",
        "custom_dataset",
        "dataset_kwargs",
        "training_split",
        "validation_split",
    }
    for bench in BENCHMARKS:
        cfgs = {}
        for variant in ("hub", "local"):
            path = TASKS_DIR / f"{bench}_{variant}.yaml"
            cfg = load_yaml(path, resolve_func=False, recursive=True)
            if "group" in cfg:  # mmlu_medical: compare the subject tasks pairwise
                assert [t.rsplit("_", 1)[0] for t in cfg["task"]] == [
                    f"mmlu_medical_{s}" for s in local_data.MMLU_MEDICAL_SUBJECTS
                ]
                cfg = load_yaml(
                    TASKS_DIR / f"mmlu_medical_anatomy_{variant}.yaml", resolve_func=False, recursive=True
                )
            cfgs[variant] = {k: v for k, v in cfg.items() if k not in source_keys}
        assert cfgs["hub"] == cfgs["local"], bench
        assert "metric_list" in cfgs["hub"] and "output_type" in cfgs["hub"]


def test_mmlu_five_shot_draws_the_dev_examples_in_order(shared_data):
    key = _key("mmlu_medical", shared_data)
    seen: list[str] = []
    lm = ScriptedLM(key, "", True)
    original = lm.loglikelihood

    def recording(requests):
        seen.extend(r.args[0] for r in requests)
        return original(requests)

    lm.loglikelihood = recording
    settings = EvalSettings(data_dir=str(shared_data), limit=1, num_fewshot={"mmlu_medical": 5})
    entries = run_benchmarks(lm, ["mmlu_medical"], settings, None)
    assert entries[0]["value"] == 1.0 and entries[0]["num_fewshot"] == 5
    with open(shared_data / "mmlu_dev" / "anatomy_dev.csv", newline="") as fh:
        dev = [rec for rec in csv.reader(fh)]
    anatomy = next(c for c in seen if "about anatomy" in c)
    positions = [anatomy.index(d[0] + "\nA. " + d[1]) for d in dev]
    assert positions == sorted(positions)  # first_n: the five dev rows, in file order
    assert anatomy.count("Answer:") == 6 and f"Answer: {dev[0][5]}\n\n" in anatomy


def test_an_interrupted_evaluation_keeps_its_finished_benchmarks(shared_data, tmp_path):
    """benchmarks.json is rewritten after every benchmark; a later call with the same resume key
    and settings reuses the scored ones (the LM is not asked again), a call with another key or
    other settings runs them again."""
    settings = EvalSettings(source="local", data_dir=str(shared_data), limit=2)
    out = tmp_path / "out"
    lm = ScriptedLM(_key("medqa", shared_data), "", True)
    first = run_benchmarks(lm, ["medqa"], settings, out, resume_key="model-a")
    saved = json.loads((out / "benchmarks.json").read_text())
    assert saved["complete"] is True and saved["resume_key"] == "model-a"
    saved["complete"] = False  # as a call killed after its first benchmark leaves it
    (out / "benchmarks.json").write_text(json.dumps(saved))

    class Refuses:  # any request means the benchmark was run again
        def __getattr__(self, name):
            raise AssertionError(f"the LM was used ({name}) although medqa was finished")

    again = run_benchmarks(Refuses(), ["medqa"], settings, out, resume_key="model-a")
    assert again == first
    assert json.loads((out / "benchmarks.json").read_text())["complete"] is True
    other = ScriptedLM(_key("medqa", shared_data), "", False)
    assert run_benchmarks(other, ["medqa"], settings, out, resume_key="model-b")[0]["value"] == 0.0
    assert other.calls > 0
    wider = EvalSettings(source="local", data_dir=str(shared_data), limit=3)
    assert run_benchmarks(lm, ["medqa"], wider, out, resume_key="model-b")[0]["n"] == 3


def test_items_evaluates_exactly_the_named_items(shared_data: Path, tmp_path: Path) -> None:
    """--items: only those indices of a task are asked and scored (n counts them), logged under
    their own doc_id, and recorded in the row's versions."""
    settings = EvalSettings(source="local", data_dir=str(shared_data), items={"medqa": [7, 2]})
    lm = ScriptedLM(_key("medqa", shared_data), "", True)
    (entry, _norm) = run_benchmarks(lm, ["medqa"], settings, tmp_path / "out")
    assert entry["n"] == 2 and entry["value"] == 1.0 and entry["items"] == [7, 2]
    assert lm.calls == 2 * 4  # two questions, four options each
    logged = [
        json.loads(x) for x in (tmp_path / "out" / "samples" / "medqa_local.jsonl").read_text().splitlines()
    ]
    assert sorted(int(x["doc_id"]) for x in logged) == [2, 7]
    row = entries_to_rows([entry], {"run_id": "r"})[0]
    assert json.loads(row["versions"])["eval_items"] == [7, 2]
    with pytest.raises(ValueError, match="not a single-task benchmark"):
        EvalSettings(items={"mmlu_medical": [1]})
    with pytest.raises(ValueError, match="item indices >= 0"):
        EvalSettings(items={"medqa": [-1]})


def test_items_flag_mistakes_are_named_before_any_model_loads(capsys) -> None:
    from repro.cli import main

    for flags, msg in [
        (
            ["--benchmarks", "medqa", "--items", "humaneval=3"],
            "--items names humaneval, which is not among --benchmarks (medqa)",
        ),
        (["--benchmarks", "medqa", "--items", "medqa=a"], "--items: expected BENCH=I,J,..."),
        (["--benchmarks", "mmlu_medical", "--items", "mmlu_medical=1"], "not a single-task benchmark"),
    ]:
        # A model name that does not exist: reaching the model load would fail differently.
        assert main(["eval", "--model", "no-such-model-dir", *flags]) == 2
        assert msg in capsys.readouterr().err
    # Numbers out of range are the parser's (repro/core/argtypes.py): the flag and the range.
    for flags, msg in [
        (
            ["--benchmarks", "humaneval", "--max-gen-toks", "0"],
            "argument --max-gen-toks: expected an integer >= 1",
        ),
        (["--benchmarks", "medqa", "--limit", "0"], "argument --limit: expected an integer >= 1"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["eval", "--model", "no-such-model-dir", *flags])
        assert e.value.code == 2 and msg in capsys.readouterr().err
