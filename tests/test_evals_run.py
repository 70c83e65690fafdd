"""`cluster-repro eval` and the pipeline's eval stage with a real (tiny random) model through
lm-eval on every local benchmark, result rows, missing data, and batch-size invariance."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from evals.run import EvalSettings, entries_to_rows, expand_benchmarks, make_lm, run_benchmarks
from repro.config import ExperimentConfig, LoraConfig, ModelConfig
from repro.results import COLUMNS, PART_NAME


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
    entries = run_benchmarks(object(), ["medqa", "mbpp_plus", "mmlu_medical"],
                             EvalSettings(data_dir=str(empty)), tmp_path / "out")
    assert [(e["benchmark"], e["status"]) for e in entries] == [
        ("medqa", "missing"), ("mbpp_plus", "missing"), ("mmlu_medical", "missing")]
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
    rc = main(["eval", "--model", "tiny-random-llama", "--benchmarks", "all", "--limit", "2",
               "--max-gen-toks", "8", "--batch-size", "4", "--data-dir", str(shared_data),
               "--output-dir", str(out)])
    assert rc == 3  # HumanEval+ has no offline copy: missing, so not every benchmark ran
    captured = capsys.readouterr()
    assert "NOT EVALUATED: humaneval_plus (missing)" in captured.err
    rows = list(csv.DictReader(open(out / PART_NAME, newline="")))
    assert list(rows[0]) == COLUMNS
    got = {(r["benchmark"], r["metric"]): r for r in rows}
    expected_n = {"humaneval": 2, "mbpp": 2, "mbpp_plus": 2, "medqa": 2, "medmcqa": 2,
                  "pubmedqa": 2, "mmlu_medical": 12}
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
    assert {"humaneval_local", "mbpp_local", "mbpp_plus_local", "medqa_local",
            "medmcqa_local", "pubmedqa_local", "mmlu_medical_anatomy_local"} <= logs
    sample = json.loads((out / "samples" / "humaneval_local.jsonl").read_text().splitlines()[0])
    assert sample["doc"]["task_id"] == "HumanEval/0" and "pass@1" in sample
    assert "medqa" in captured.out and "total wall time" in captured.out


def _tiny(tmp_path: Path, lora: bool):
    from repro.models import load_model_and_tokenizer, materialize_model

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
        entries = run_benchmarks(make_lm(model, tok, batch_size=bs), ["medqa", "medmcqa"],
                                 settings, tmp_path / f"bs{bs}")
        values[bs] = [(e["benchmark"], e["metric"], e["value"]) for e in entries]
    assert values[1] == values[8]
    rows = compare(tmp_path / "bs1", tmp_path / "bs8")
    assert [r["task"] for r in rows] == ["medmcqa_local", "medqa_local"]
    for r in rows:
        assert r["n"] == 6 and r["items_with_different_score"] == 0
        assert r["max_abs_loglik_diff"] < 1e-3


def test_pipeline_eval_stage_runs_the_configured_benchmarks(shared_data, tmp_path):
    """The run's fine-tuned model (base + LoRA adapter) is evaluated and its rows written."""
    from repro.io import atomic_write_json
    from repro.models import save_finetuned
    from repro.pipeline import result_rows, stage_eval, stage_marker

    mcfg, model_dir, model, tok = _tiny(tmp_path, lora=True)
    cfg = ExperimentConfig(name="evalhook", output_dir=str(tmp_path), data_dir=str(shared_data),
                           model=mcfg)
    cfg.eval.heldout_loss = cfg.eval.demo_tasks = False
    cfg.eval.benchmarks = ["medqa", "humaneval_plus"]
    cfg.eval.limit = 2
    run_dir = cfg.run_dir()
    atomic_write_json(stage_marker(run_dir, "model"), {"model_dir": str(model_dir)})
    (run_dir / "pool.jsonl").write_text("")
    (run_dir / "heldout.jsonl").write_text("")
    save_finetuned(model, tok, run_dir / "model")
    ev = stage_eval(cfg, run_dir)
    assert [(e["benchmark"], e["metric"], e["status"]) for e in ev["benchmarks"]] == [
        ("medqa", "acc", "ok"), ("medqa", "acc_norm", "ok"),
        ("humaneval_plus", "missing", "missing")]
    assert (run_dir / "eval_benchmarks" / "samples" / "medqa_local.jsonl").is_file()
    # The results stage turns them into rows (other stages' markers written as a finished run
    # would have them).
    for name, info in {"pool": {}, "select": {"info": {}, "kept_fraction": 1.0, "n_selected": 1,
                                              "n_pool": 1},
                       "schedule": {}, "train": {"train_s": 1.0, "train_stage_s": 1.0,
                                                 "peak_mem_mb": 1.0}}.items():
        atomic_write_json(stage_marker(run_dir, name), {"stage_s": 0.0, **info})
    atomic_write_json(stage_marker(run_dir, "eval"), {**ev, "stage_s": 1.0})
    rows = {(r["benchmark"], r["metric"]): r for r in result_rows(cfg, run_dir)}
    assert rows[("medqa", "acc")]["n"] == 2 and rows[("medqa", "acc")]["run_id"].startswith(
        "evalhook-")
    assert rows[("humaneval_plus", "missing")]["value"] is None


def test_hub_variant_without_hub_access_is_reported_missing(monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from tests.test_evals_tasks import ScriptedLM

    entries = run_benchmarks(ScriptedLM({}, "", True), ["pubmedqa"],
                             EvalSettings(source="hub"), None)
    assert [(e["benchmark"], e["status"], e["task"]) for e in entries] == [
        ("pubmedqa", "missing", "pubmedqa_hub")]
    assert "hub data unreachable" in entries[0]["reason"]
    assert "MISSING benchmark pubmedqa" in capsys.readouterr().err
