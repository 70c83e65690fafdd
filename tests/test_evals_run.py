"""`cluster-repro eval` and the pipeline's eval stage with a real (tiny random) model through
lm-eval on every local benchmark, result rows, missing data, batch-size invariance, evaluation
in several real processes (spawned, and as the tasks of a job), and the generation limit."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evals.benchmarks import EvalSettings, expand_benchmarks
from evals.entries import entries_to_rows
from evals.harness import make_lm
from evals.run import run_benchmarks
from repro.core.config.builder import ConfigError
from repro.core.config.load import load_config
from repro.core.config.schema import ExperimentConfig, LoraConfig, ModelConfig
from repro.core.results import COLUMNS, PART_NAME


def test_expand_benchmarks_aliases_order_and_typos():
    assert expand_benchmarks("medical") == ["medqa", "medmcqa", "pubmedqa", "mmlu_medical"]
    assert expand_benchmarks(["humaneval", "code"])[:2] == ["humaneval", "humaneval_plus"]
    assert len(expand_benchmarks("all")) == 8
    with pytest.raises(ValueError, match="did you mean 'pubmedqa'"):
        expand_benchmarks("pubmedq")


def test_local_shots_only_where_a_shot_split_exists():
    assert EvalSettings(num_fewshot={"mmlu_medical": 5}).num_fewshot == {"mmlu_medical": 5}
    with pytest.raises(ValueError, match="medqa has no local split"):
        EvalSettings(num_fewshot={"medqa": 3})
    assert EvalSettings(source="hub", num_fewshot={"medqa": 3}).num_fewshot == {"medqa": 3}


def test_missing_data_gives_loud_missing_rows_and_nothing_is_skipped(tmp_path, capsys):
    empty = tmp_path / "nodata"
    empty.mkdir()
    entries = run_benchmarks(
        object(), ["medqa", "mbpp_plus", "mmlu_medical"], EvalSettings(data_dir=str(empty)), tmp_path / "out"
    )
    assert [(e["benchmark"], e["status"]) for e in entries] == [
        ("medqa", "missing"),
        ("mbpp_plus", "missing"),
        ("mmlu_medical", "missing"),
    ]
    assert "medagents/medqa/test.jsonl" in entries[0]["reason"]
    err = capsys.readouterr().err
    assert err.count("MISSING benchmark") == 3
    rows = entries_to_rows(entries, {"run_id": "r", "versions": json.dumps({"torch": "x"})})
    assert all(r["metric"] == "missing" and r["value"] is None and r["n"] == 0 for r in rows)
    v = json.loads(rows[0]["versions"])
    assert v["torch"] == "x" and v["lm_eval"] == "0.4.13" and "not found" in v["status_reason"]
    saved = json.loads((tmp_path / "out" / "benchmarks.json").read_text())
    assert [e["status"] for e in saved["entries"]] == ["missing"] * 3


def test_cli_evaluates_the_tiny_model_on_every_local_benchmark(shared_data, tmp_path, capsys):
    from repro.cli import main

    out = tmp_path / "eval"
    rc = main(
        [
            "eval",
            "--model",
            "tiny-random-llama",
            "--benchmarks",
            "all",
            "--limit",
            "2",
            "--max-gen-toks",
            "8",
            "--batch-size",
            "4",
            "--data-dir",
            str(shared_data),
            "--out",
            str(out),
        ]
    )
    assert rc == 3  # HumanEval+ has no offline copy: missing, so not every benchmark ran
    captured = capsys.readouterr()
    assert "NOT EVALUATED: humaneval_plus (missing)" in captured.err
    (out,) = (out / "evals").iterdir()  # this evaluation's folder, named by its eval_id
    rows = list(csv.DictReader(open(out / PART_NAME, newline="")))
    assert list(rows[0]) == COLUMNS
    got = {(r["benchmark"], r["metric"]): r for r in rows}
    expected_n = {
        "humaneval": 2,
        "mbpp": 2,
        "mbpp_plus": 2,
        "medqa": 2,
        "medmcqa": 2,
        "pubmedqa": 2,
        "mmlu_medical": 12,
    }
    for bench, n in expected_n.items():
        metric = "pass@1" if bench in ("humaneval", "mbpp", "mbpp_plus") else "acc"
        r = got[(bench, metric)]
        assert 0.0 <= float(r["value"]) <= 1.0 and int(r["n"]) == n, r
        v = json.loads(r["versions"])
        assert v["lm_eval"] == "0.4.13" and v["lm_eval_task"] == f"{bench}_local"
        assert v["lm_eval_task_version"] == "1.0" and "torch" in v
        assert v.get("eval_max_gen_toks") == (8 if metric == "pass@1" else None)  # the cap
        assert r["model"] == "tiny-random-llama" and r["method"] == "base" and r["git_sha"]
    assert got[("humaneval_plus", "missing")]["value"] == ""
    assert len([b for b, _ in got if b.startswith("mmlu_medical/")]) == 6
    logs = {p.stem for p in (out / "samples").glob("*.jsonl")}
    assert {
        "humaneval_local",
        "mbpp_local",
        "mbpp_plus_local",
        "medqa_local",
        "medmcqa_local",
        "pubmedqa_local",
        "mmlu_medical_anatomy_local",
    } <= logs
    sample = json.loads((out / "samples" / "humaneval_local.jsonl").read_text().splitlines()[0])
    assert sample["doc"]["task_id"] == "HumanEval/0" and "pass@1" in sample
    assert "medqa" in captured.out and "total wall time" in captured.out
    # Progress on stderr, plain lines (no carriage return): per benchmark a start line, its
    # requests done / total, and an end line with the score.
    assert "\r" not in captured.err
    for bench in expected_n:
        metric = "pass@1" if bench in ("humaneval", "mbpp", "mbpp_plus") else "acc"
        kind = "generate_until" if metric == "pass@1" else "loglikelihood"
        assert f"[cluster-repro eval] {bench}: lm-eval task {bench}_local, limit 2" in captured.err
        assert re.search(
            rf"\[cluster-repro eval\] {bench} {kind}: (\d+)/\1 requests \(100%\) "
            r"in [\d.]+ s",
            captured.err,
        ), bench
        assert f"[cluster-repro eval] {bench}: {metric} = " in captured.err
    # The same scores in lm-eval's JSON shape, equal to the rows.
    harness = json.loads((out / "lm_eval_results.json").read_text())
    _same_as_rows(harness, rows)
    assert harness["config"]["batch_size"] == 4 and harness["config"]["limit"] == 2
    subjects = {
        json.loads(r["versions"])["lm_eval_task"] for r in rows if r["benchmark"].startswith("mmlu_medical/")
    }
    assert sorted(harness["group_subtasks"]["mmlu_medical_local"]) == sorted(subjects)
    assert len(subjects) == 6
    assert harness["groups"]["mmlu_medical_local"] == harness["results"]["mmlu_medical_local"]
    assert harness["cluster_repro"]["not_evaluated"]["humaneval_plus"]["status"] == "missing"
    assert "humaneval_plus_local" not in harness["results"]


def _same_as_rows(harness: dict, rows: list[dict]) -> None:
    """Every scored row's value and stderr in results[task]["<metric>,none"] and
    ["<metric>_stderr,none"] ("N/A" where the row has none), and nothing else there."""
    expected: dict[str, dict] = {}
    for r in rows:
        if r["value"] in ("", None) or r["benchmark"].startswith(("cost/", "cluster/", "worker/")):
            continue
        v = json.loads(r["versions"])
        task = v.get("lm_eval_task", r["benchmark"])
        e = expected.setdefault(task, {"alias": r["benchmark"]})
        e[f"{r['metric']},none"] = float(r["value"])
        e[f"{r['metric']}_stderr,none"] = "N/A" if r["stderr"] in ("", None) else float(r["stderr"])
        if "lm_eval_task" in v:
            assert harness["versions"][task] == v["lm_eval_task_version"]
            assert harness["n-shot"][task] == v["num_fewshot"]
        assert harness["n-samples"][task] == {"effective": int(r["n"])}
    assert harness["results"] == expected and expected


def _tiny(tmp_path: Path, lora: bool):
    from repro.core.models import load_model_and_tokenizer, materialize_model

    mcfg = ModelConfig(name_or_path="tiny-random-llama", lora=LoraConfig(enabled=lora))
    model_dir = materialize_model(mcfg, seed=0)
    model, tok = load_model_and_tokenizer(model_dir, mcfg)
    return mcfg, model_dir, model, tok


def test_batch_size_1_and_8_give_the_same_scores(shared_data, tmp_path):
    """Log-likelihood tasks: same per-item scores and log-likelihoods (to float rounding)."""
    from evals.compare import compare

    _, _, model, tok = _tiny(tmp_path, lora=False)
    settings = EvalSettings(data_dir=str(shared_data), limit=6)
    values = {}
    for bs in (1, 8):
        entries = run_benchmarks(
            make_lm(model, tok, batch_size=bs), ["medqa", "medmcqa"], settings, tmp_path / f"bs{bs}"
        )
        values[bs] = [(e["benchmark"], e["metric"], e["value"]) for e in entries]
    assert values[1] == values[8]
    rows = compare(tmp_path / "bs1", tmp_path / "bs8")
    assert [r["task"] for r in rows] == ["medmcqa_local", "medqa_local"]
    for r in rows:
        assert r["n"] == 6 and r["items_with_different_score"] == 0
        assert r["max_abs_loglik_diff"] < 1e-3


def _finished_run(
    tmp_path: Path,
    shared_data: Path,
    lora: bool,
    name: str,
    benchmarks: list[str],
    world_size: int = 4,
    **eval_keys,
) -> tuple[ExperimentConfig, Path, object]:
    """A run directory as training leaves it (the model stage's marker, empty pools, the
    fine-tuned tiny model), with eval settings; -> (config, run dir, tokenizer)."""
    from repro.core.io import atomic_write_json
    from repro.core.models import save_finetuned
    from repro.core.rundir import stage_marker
    from repro.core.store import write_run_record

    mcfg, model_dir, model, tok = _tiny(tmp_path, lora=lora)
    cfg = ExperimentConfig(
        name=name, output_dir=str(tmp_path), data_dir=str(shared_data), model=mcfg, world_size=world_size
    )
    cfg.eval.heldout_loss = False
    cfg.eval.benchmarks = benchmarks
    for key, value in eval_keys.items():
        setattr(cfg.eval, key, value)
    run_dir = cfg.run_dir()
    atomic_write_json(stage_marker(run_dir, "model"), {"model_dir": str(model_dir)})
    atomic_write_json(stage_marker(run_dir, "train"), {"status": "ok"})
    write_run_record(run_dir, cfg)
    (run_dir / "pool.jsonl").write_text("")
    (run_dir / "heldout.jsonl").write_text("")
    save_finetuned(model, tok, run_dir / "model")
    return cfg, run_dir, tok


def test_pipeline_eval_stage_runs_the_configured_benchmarks(shared_data, tmp_path, monkeypatch):
    """The run's fine-tuned model (base + LoRA adapter) is evaluated and its rows written; the
    generation limit the config states is used and recorded in the rows."""
    from repro.core.io import atomic_write_json
    from repro.core.rundir import stage_marker
    from repro.pipeline import stage_eval
    from repro.run_rows import result_rows

    cfg, run_dir, tok = _finished_run(
        tmp_path,
        shared_data,
        True,
        "evalhook",
        ["medqa", "humaneval_plus", "humaneval"],
        limit=2,
        max_new_tokens={"humaneval": 3, "demo": 5},
    )
    # As a job's task 1 has it: lm-eval's simple_evaluate returns nothing where LOCAL_RANK != 0.
    monkeypatch.setenv("LOCAL_RANK", "1")
    ev = stage_eval(cfg, run_dir)
    assert [(e["benchmark"], e["metric"], e["status"]) for e in ev["benchmarks"]] == [
        ("medqa", "acc", "ok"),
        ("medqa", "acc_norm", "ok"),
        ("humaneval_plus", "missing", "missing"),
        ("humaneval", "pass@1", "ok"),
    ]
    assert (run_dir / "eval_benchmarks" / "samples" / "medqa_local.jsonl").is_file()
    humaneval = [
        json.loads(x)
        for x in (run_dir / "eval_benchmarks" / "samples" / "humaneval_local.jsonl").read_text().splitlines()
    ]
    assert len(humaneval) == 2 and all(_n_tokens(tok, s) <= 3 for s in humaneval)
    # The results stage turns them into rows (other stages' markers and files written as a
    # finished run would have them).
    from repro.core.types import Schedule, ScheduleDiagnostics, Selection

    atomic_write_json(run_dir / "selection.json", Selection(ids=["x"]).to_dict("full"))
    sched = Schedule(order=[[["x"]]], worker_weights=[1.0], diagnostics=ScheduleDiagnostics())
    atomic_write_json(run_dir / "schedule.json", sched.to_dict())
    for name, info in {
        "pool": {},
        "select": {"info": {}, "kept_fraction": 1.0, "n_selected": 1, "n_pool": 1},
        "schedule": {},
        "train": {"train_s": 1.0, "train_stage_s": 1.0, "peak_mem_mb": 1.0},
    }.items():
        atomic_write_json(stage_marker(run_dir, name), {"stage_s": 0.0, **info})
    atomic_write_json(stage_marker(run_dir, "eval"), {**ev, "stage_s": 1.0})
    rows = {(r["benchmark"], r["metric"]): r for r in result_rows(cfg, run_dir)}
    assert rows[("medqa", "acc")]["n"] == 2 and rows[("medqa", "acc")]["run_id"].startswith("evalhook-")
    assert rows[("humaneval_plus", "missing")]["value"] is None
    assert json.loads(rows[("humaneval", "pass@1")]["versions"])["eval_max_gen_toks"] == 3
    assert "eval_max_gen_toks" not in json.loads(rows[("medqa", "acc")]["versions"])
    # The results stage writes the rows and the same scores in lm-eval's JSON shape.
    from repro.core.results import read_rows
    from repro.pipeline import stage_results

    stage_results(cfg, run_dir)
    harness = json.loads((run_dir / "lm_eval_results.json").read_text())
    _same_as_rows(harness, read_rows(run_dir / PART_NAME))
    assert set(harness["results"]) >= {"medqa_local", "humaneval_local"}
    assert harness["config"]["model"] == cfg.model.name_or_path
    assert harness["config"]["max_new_tokens"] == {"humaneval": 3, "demo": 5}
    assert harness["cluster_repro"]["run_id"] == rows[("medqa", "acc")]["run_id"]
    assert harness["cluster_repro"]["not_evaluated"]["humaneval_plus"]["status"] == "missing"


def _n_tokens(tok, sample: dict) -> int:
    """Tokens of a logged generation (the raw response, before stop-sequence filtering)."""
    (text,) = sample["resps"][0]
    return len(tok(text, add_special_tokens=False)["input_ids"])


def _scores(entries: list[dict]) -> list[tuple]:
    return [
        (e["benchmark"], e["metric"], e["status"], e["value"], e["stderr"], e["n"], e.get("max_gen_toks"))
        for e in entries
    ]


def _same_items(a: Path, b: Path) -> None:
    """Two evaluations logged the same items with the same scores and generations; their
    log-likelihoods agree to float rounding (other batch neighbours: docs/benchmarks.md)."""
    from evals.compare import compare

    rows = compare(a, b)
    assert len(rows) == len(list((a / "samples").glob("*.jsonl"))) == 8  # 6 MMLU subjects
    for r in rows:
        assert r["items_with_different_score"] == 0 and r["different_generations"] == 0, r
        assert r["max_abs_loglik_diff"] < 1e-4 and r["n"] == 5, r


# A finished run of world size 2 (as a 2-task job would train it), evaluated on MedQA
# (log-likelihood; 5 items: shares of 3 and 2), MMLU-medical (grouped: pooled over its 6 subjects,
# 30 items) and HumanEval (code generation under a 3-token limit, scored in the sandbox).
SPLIT_BENCHMARKS = ["medqa", "mmlu_medical", "humaneval"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """(config, run dir, tokenizer, entries, output dir) of a lone process's evaluation."""
    from evals.parallel import evaluate, job_for_run
    from tests.conftest import SHARED_DATA

    if SHARED_DATA is None:
        pytest.fail("shared data not found: set CLUSTER_REPRO_DATA to the shared/data directory")
    tmp = tmp_path_factory.mktemp("evaldp")
    cfg, run_dir, tok = _finished_run(
        tmp, SHARED_DATA, False, "evaldp", SPLIT_BENCHMARKS, world_size=2, limit=5, max_new_tokens=3
    )
    out = tmp / "one"
    entries = evaluate(dataclasses.replace(job_for_run(cfg, run_dir), out_dir=str(out)), 1)
    assert [e["status"] for e in entries] == ["ok"] * len(entries)
    assert [e["n"] for e in entries if "/" not in e["benchmark"]] == [5, 5, 30, 5]
    return cfg, run_dir, tok, entries, out


def test_rows_from_items_equal_the_harness_own_aggregation(one_process):
    """The entries computed from gathered per-item results (mean, stderr, the group's pooled
    mean and stderr) equal lm-eval's own results for the same items, to the last bit."""
    import lm_eval

    from evals.benchmarks import EvalSettings
    from evals.harness import _harness_as_one_process, task_manager
    from repro.core.models import load_finetuned

    cfg, run_dir, _, one, _ = one_process
    model, tok = load_finetuned(
        run_dir / "model",
        Path(json.loads((run_dir / "stages" / "model.json").read_text())["model_dir"]),
        cfg.model,
    )
    lm = make_lm(model, tok, batch_size=cfg.eval.batch_size)
    got = {(e["task"], e["metric"]): (e["value"], e["stderr"], e["n"]) for e in one}
    tm = task_manager(EvalSettings(data_dir=cfg.data_dir))
    for task in ("medqa_local", "mmlu_medical_local"):  # one call per benchmark, as the suite
        with _harness_as_one_process():
            res = lm_eval.simple_evaluate(
                model=lm, tasks=[task], task_manager=tm, limit=5, bootstrap_iters=1000, log_samples=False
            )
        for name, r in res["results"].items():
            for metric in ("acc", "acc_norm"):
                if (name, metric) in got:
                    n = 30 if name == "mmlu_medical_local" else 5  # the group: 6 subjects x 5
                    assert got[(name, metric)] == (r[f"{metric},none"], r[f"{metric}_stderr,none"], n), name
    assert sum(1 for key in got if key[0].startswith("mmlu_medical_")) == 7  # group + 6


def test_two_spawned_processes_give_the_rows_of_one(one_process, tmp_path):
    """eval.workers 2 on CPU: 2 real processes, each scoring a share of every task's items, give
    exactly the entries (value, stderr, n) of 1 process, for the same items and results. The
    stated 3-token limit is the one generation used, and the one the rows record."""
    from evals.parallel import evaluate, job_for_run

    cfg, run_dir, tok, one, one_dir = one_process
    two = evaluate(dataclasses.replace(job_for_run(cfg, run_dir), out_dir=str(tmp_path)), 2)
    assert _scores(two) == _scores(one)
    assert json.loads((tmp_path / "benchmarks.json").read_text())["processes"] == 2
    _same_items(one_dir, tmp_path)
    humaneval = [
        json.loads(x) for x in (tmp_path / "samples" / "humaneval_local.jsonl").read_text().splitlines()
    ]
    assert [s["doc_id"] for s in humaneval] == [0, 1, 2, 3, 4]
    lengths = [_n_tokens(tok, s) for s in humaneval]
    assert max(lengths) == 3, lengths  # the random model does not stop early on all five
    rows = entries_to_rows(two, {"run_id": "r"})
    assert {
        json.loads(r["versions"]).get("eval_max_gen_toks") for r in rows if r["benchmark"] == "humaneval"
    } == {3}


def test_the_tasks_of_a_job_evaluate_together(one_process, tmp_path, monkeypatch):
    """In a job whose 2 tasks trained together (RANK, WORLD_SIZE, LOCAL_RANK as slurm/jobs.py
    or torchrun set them), task 0's eval stage (here, in this process) and task 1's
    join_eval_stage (another OS process) score the benchmarks together, with the entries of a
    lone process."""
    from repro.core.distributed import free_port
    from repro.pipeline import stage_eval

    cfg, run_dir, _, one, one_dir = one_process
    shutil.rmtree(run_dir / "eval_benchmarks", ignore_errors=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    # The evaluation meets on MASTER_PORT + 1 (the training group's port stays untouched).
    job_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port() - 1), "WORLD_SIZE": "2"}
    task1 = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json, sys; from pathlib import Path\n"
            "from repro.core.config.load import from_dict\nfrom repro.pipeline import join_eval_stage\n"
            "cfg = from_dict(json.loads(Path(sys.argv[1]).read_text()))\n"
            "join_eval_stage(cfg, cfg.run_dir())\n",
            str(tmp_path / "config.json"),
        ],
        env={
            **os.environ,
            **job_env,
            "RANK": "1",
            "LOCAL_RANK": "1",
            "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for key, value in {**job_env, "RANK": "0", "LOCAL_RANK": "0"}.items():
            monkeypatch.setenv(key, value)
        together = stage_eval(cfg, run_dir)["benchmarks"]
    finally:
        output = task1.communicate(timeout=300)[0]
    assert task1.returncode == 0, output[-3000:]
    assert _scores(together) == _scores(one)
    assert json.loads((run_dir / "eval_benchmarks" / "benchmarks.json").read_text())["processes"] == 2
    _same_items(one_dir, run_dir / "eval_benchmarks")


def test_cli_evaluates_a_run_with_its_own_data_dir(one_process, tmp_path):
    """`cluster-repro eval --run`: the run's config gives the data directory (a Path, saved in
    benchmarks.json's settings as text) and the rows carry the run's id."""
    from repro.cli import main
    from repro.core.config.load import save_config

    cfg, run_dir, _, one, _ = one_process
    save_config(cfg, run_dir / "config.yaml")
    assert main(["eval", "--run", str(run_dir), "--benchmarks", "medqa", "--limit", "5"]) == 0
    (out,) = (run_dir / "evals").iterdir()  # the run's own folder of this evaluation
    rows = list(csv.DictReader(open(out / PART_NAME, newline="")))
    assert [(r["benchmark"], r["metric"], float(r["value"])) for r in rows] == [
        (e["benchmark"], e["metric"], e["value"]) for e in one if e["benchmark"] == "medqa"
    ]
    assert rows[0]["run_id"] == f"{cfg.name}-{cfg.hash()}" and rows[0]["eval_id"] == out.name
    saved = json.loads((out / "benchmarks.json").read_text())
    assert saved["settings"]["data_dir"] == cfg.data_dir
    # It belongs to the run: --out and --name are the model's, refused with --run.
    assert main(["eval", "--run", str(run_dir), "--benchmarks", "medqa", "--out", str(tmp_path)]) == 2


def test_generation_limit_task_names_are_checked_by_preflight():
    """A per-task limit for a name that is no generation task is a preflight problem naming the
    key, with a did-you-mean (evals/ owns the task list; the config loads)."""
    from repro.preflight import preflight
    from repro.problems import CheckContext

    for override, message in [
        (
            "eval.max_new_tokens.humaneval_pluss=9",
            "'humaneval_pluss' is not a generation task; did you mean 'humaneval_plus'?",
        ),
        ("eval.max_new_tokens.medqa=9", "'medqa' is not a generation task"),
    ]:
        found = [
            p
            for p in preflight(load_config(None, [override]), CheckContext())
            if p.key.startswith("eval.max_new_tokens")
        ]
        assert found and message in str(found[0]), (override, found)


def test_generation_limits_are_checked_at_config_load():
    """eval.max_new_tokens: a positive number, or one per generation task; mistakes name the
    key and what was expected."""
    ev = load_config(None, ["eval.max_new_tokens.humaneval=7"]).eval
    assert ev.gen_limit("humaneval") == 7 and ev.gen_limit("mbpp") is None
    assert ev.gen_limit("demo") is None
    assert load_config(None, ["eval.max_new_tokens=9"]).eval.gen_limit("mbpp") == 9
    for override, message in [
        ("eval.max_new_tokens=0", "eval.max_new_tokens: expected a positive number of tokens"),
        ("eval.max_new_tokens=-3", "eval.max_new_tokens: expected a positive number"),
        ("eval.max_new_tokens=many", "eval.max_new_tokens: expected"),
        (
            "eval.max_new_tokens.humaneval=0",
            "eval.max_new_tokens.humaneval: expected a positive number of tokens, got 0",
        ),
        ("eval.max_new_tokens.humaneval=1.5", "eval.max_new_tokens.humaneval: expected"),
        ("eval.workers=0", "eval.workers: expected a number of processes >= 1"),
        ("eval.limit=0", "eval.limit: expected a number of items >= 1"),
    ]:
        with pytest.raises(ConfigError, match=__import__("re").escape(message)):
            load_config(None, [override])


def test_the_paper_recipe_scores_code_as_magicoder_does():
    """configs/paper/recipe.yaml scores the four code benchmarks under the evalplus protocol, at
    Magicoder's generation limit (evals/evalplus/protocol.py MAX_NEW_TOKENS, 512)."""
    from evals.benchmarks import CODE_BENCHMARKS
    from evals.evalplus.protocol import MAX_NEW_TOKENS

    recipe = load_config(Path(__file__).resolve().parent.parent / "configs" / "paper" / "recipe.yaml")
    assert recipe.eval.protocol == {b: "evalplus" for b in CODE_BENCHMARKS}
    assert {recipe.eval.gen_limit(b) for b in CODE_BENCHMARKS} == {MAX_NEW_TOKENS} == {512}
    assert {s.format for s in recipe.data.sources} == {"magicoder"}  # the template it is scored in


def test_hub_variant_without_hub_access_is_reported_missing(monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from tests.test_evals_tasks import ScriptedLM

    entries = run_benchmarks(ScriptedLM({}, "", True), ["pubmedqa"], EvalSettings(source="hub"), None)
    assert [(e["benchmark"], e["status"], e["task"]) for e in entries] == [
        ("pubmedqa", "missing", "pubmedqa_hub")
    ]
    assert "hub data unreachable" in entries[0]["reason"]
    assert "MISSING benchmark pubmedqa" in capsys.readouterr().err
