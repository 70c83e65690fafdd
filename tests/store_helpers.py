"""Tiny run folders written through the suite's real writers, without training: for the tests of
the results store and its readers (report, claims, status, results, the matchers).

A fake run is a real run folder: its config (`save_config`) and record (`write_run_record`),
stage markers shaped as the pipeline writes them (with their attempts in stages/attempts.json),
selection.json / schedule.json through the typed writers, and its result rows written by the real
results stage (`repro.pipeline.stage_results`, from those files). Only the numbers are chosen by
the test (seeded, synthetic: not measurements). An evaluation of a run (`fake_eval`) or of a
model alone (`fake_model_eval`) goes through `cluster-repro eval`'s own writer
(evals.cli.write_evaluation) into the folder the command would use.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro.core import rundir
from repro.core.config.load import load_config, save_config
from repro.core.config.schema import ExperimentConfig, eval_hash
from repro.core.fingerprints import run_file_fingerprints
from repro.core.io import atomic_write_json, atomic_write_jsonl, atomic_write_text
from repro.core.store import EVALS_DIR, write_eval_record, write_run_record
from repro.core.types import ScheduleDiagnostics, Selection, SelectionDiagnostics, StepCost

CATEGORIES = ("a", "b", "c")
STAGES = ("model", "pool", "select", "schedule", "train", "eval", "results")


def entry(
    benchmark: str,
    value: float,
    n: int = 20,
    metric: str | None = None,
    protocol: str = "lm-eval",
    limit: int | None = None,
    kind: str | None = None,
    status: str = "ok",
) -> dict[str, Any]:
    """One benchmark entry as evals/entries.py makes them (what the eval stage records)."""
    from evals.benchmarks import known_benchmarks

    known = known_benchmarks([])
    b = known.get(benchmark)
    return {
        "benchmark": benchmark,
        "kind": kind or (b.kind if b else "other"),
        "task": f"{benchmark}_local",
        "task_version": "1.0",
        "metric": metric or (b.metrics[0] if b else "acc") if status == "ok" else status,
        "value": value if status == "ok" else None,
        "stderr": None,
        "n": n if status == "ok" else 0,
        "source": "local",
        "lm_eval_version": "0.4.13",
        "limit": limit,
        "num_fewshot": 0,
        "seconds": 1.0,
        "status": status,
        "reason": None if status == "ok" else "its data was not found",
        "harness_task": benchmark,
        "protocol": protocol,
    }


def _marker(run_dir: Path, stage: str, info: dict[str, Any], stage_s: float) -> dict[str, Any]:
    """Write stage `stage`'s marker as repro/pipeline.py `_stage` does (its attempt recorded,
    its outputs fingerprinted), with a chosen `stage_s`."""
    from repro.core import stages

    rundir.start(run_dir, stage)
    info = {**info, "stage_s": stage_s}
    if stage in stages.OUTPUTS:
        info["outputs"] = run_file_fingerprints(run_dir, stage)
    atomic_write_json(run_dir / "stages" / f"{stage}.json", info)
    rundir.finish(run_dir, stage, "done", stage_s)
    return info


def fake_run(
    root: Path,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    base: str = "demo-quick",
    seed: int = 0,
    n_selected: int | None = None,
    n_pool: int = 96,
    loss: float = 2.0,
    train_s: float = 10.0,
    selection_s: float = 0.1,
    tokens_per_step: float = 400.0,
    idle: float = 0.1,
    purity: float | None = None,
    purity_chance: float = 0.4,
    purity_p: float = 0.001,
    purity_max: float = 1.0,
    model_params: int | None = 135_000_000,
    benchmarks: list[dict[str, Any]] = (),
    demo_items: dict[str, float] | None = None,
    diverged_at: int | None = None,
    until: str = "results",
    fail: str | None = None,
    step_tokens: list[list[int]] | None = None,
    padding: float = 1.0,
    cfg: ExperimentConfig | None = None,
    model_dir: Path | None = None,
) -> Path:
    """A finished (or, with `until`/`fail`/`diverged_at`, an unfinished, failed or diverged) run
    of `base` + overrides (output_dir=root, seed) with the given numbers; returns its folder.
    `cfg`: the run's config as it is (e.g. from a matcher), instead of base + overrides.
    `purity`: the clusters' agreement with the categories, with its chance distribution's mean,
    the permutation p and the most a partition can reach; `model_params`: the base model's
    parameter count the model stage records (default: a 135M model's, below the paper's scale;
    None: not recorded); `model_dir`: a real model folder its model stage records, with its
    fingerprint (a compute match tokenizes the pool with it; default: a folder that is not there);
    `padding`: each step's padded tokens over its real ones in the training logs."""
    if cfg is None:
        cfg = load_config(base, [f"output_dir={root}", f"seed={seed}", *overrides])
    run_dir = cfg.run_dir()
    (run_dir / "stages").mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    write_run_record(run_dir, cfg)
    ws = cfg.world_size
    n = n_pool if n_selected is None else n_selected
    ids = [f"ex{i:04d}" for i in range(n_pool)]
    kept = ids[:n]
    steps = max(1, n // (ws * 2))
    total_steps = steps * cfg.train.epochs

    def stop(stage: str) -> bool:
        if fail == stage:
            rundir.start(run_dir, stage)
            rundir.finish(run_dir, stage, "failed", 1.0)
            return True
        return STAGES.index(stage) > STAGES.index(until)

    if stop("model"):
        return run_dir
    model_info = {"model_dir": str(root / "no-model-dir"), "inputs": {}, "model_params": model_params}
    if model_dir is not None:
        from repro.core.fingerprints import model_fingerprint

        model_info.update(model_dir=str(model_dir), inputs={"model": model_fingerprint(model_dir)})
    _marker(run_dir, "model", model_info, 0.01)
    if stop("pool"):
        return run_dir
    pool = [
        {"id": i, "prompt": "p", "response": "r", "source": "demo", "category": CATEGORIES[k % 3], "meta": {}}
        for k, i in enumerate(ids)
    ]
    atomic_write_jsonl(run_dir / "pool.jsonl", pool)
    atomic_write_jsonl(run_dir / "heldout.jsonl", pool[:6])
    cats = {c: sum(1 for x in pool if x["category"] == c) for c in CATEGORIES}
    info = {"n_pool": n_pool, "n_heldout": 6, "skipped": {}, "sources": [], "categories": cats}
    _marker(run_dir, "pool", {**info, "inputs": {"data": []}}, 0.05)
    if stop("select"):
        return run_dir
    method = cfg.selection.method
    clusters = [k % ws for k in range(n)] if method == "cluster" else None
    diag = SelectionDiagnostics(
        costs={"selection": StepCost(seconds=selection_s / 2, peak_mem_mb=100.0)},
        category_agreement={
            "purity": purity,
            "purity_chance_mean": purity_chance,
            "purity_p": purity_p,
            "purity_max": purity_max,
            "nmi": 0.5,
            "ari": 0.3,
            "n": n_pool,
        }
        if purity is not None
        else None,
        cluster_sizes_before_cap=[n_pool // ws] * ws if clusters else None,
        cluster_sizes_after_cap=[n_pool // ws] * ws if clusters else None,
    )
    sel = Selection(
        ids=kept, clusters=clusters, info={"ratio": cfg.selection.params.get("ratio")}, diagnostics=diag
    )
    atomic_write_json(run_dir / "selection.json", sel.to_dict(method))
    sel_info = {
        "method": method,
        "budget": n,
        "n_selected": n,
        "n_unique": n,
        "n_pool": n_pool,
        "kept_fraction": n / n_pool,
        "selection_s": selection_s / 2,
        "peak_mem_mb": 100.0,
        "info": sel.info,
        "inputs": {"selection": {}},
    }
    _marker(run_dir, "select", sel_info, selection_s / 2)
    if stop("schedule"):
        return run_dir
    from repro.core.types import Schedule

    order = [[kept[k::ws] for k in range(ws)] for _ in range(cfg.train.epochs)]
    shares = [idle] * ws if ws > 1 else []
    sched = Schedule(
        order=order,
        worker_weights=[1.0] * ws,
        diagnostics=ScheduleDiagnostics(
            allocation_s=0.01, predicted_idle_share=idle if ws > 1 else None, worker_idle_shares=shares
        ),
    )
    atomic_write_json(run_dir / "schedule.json", sched.to_dict())
    derived = {"total_steps": total_steps, "steps_per_epoch": steps, "world_size": ws}
    atomic_write_json(run_dir / "derived.json", derived)
    tokens = step_tokens or [[int(tokens_per_step)] * ws for _ in range(total_steps)]
    atomic_write_json(run_dir / "step_tokens.json", {"step_tokens": tokens, "predicted_idle_share": idle})
    atomic_write_text(run_dir / "selection.csv", "example_id,cluster,worker,position,weight\n")
    _marker(
        run_dir,
        "schedule",
        {
            "allocator": cfg.allocation.method,
            "allocation_s": 0.01,
            "derived": derived,
            "worker_weights": [1.0] * ws,
        },
        selection_s / 2,
    )
    if stop("train"):
        return run_dir
    for k in range(ws):
        atomic_write_jsonl(
            run_dir / "train_log" / f"rank{k}.jsonl",
            [
                {
                    "step": s,
                    "rank": k,
                    "tokens": tokens[s][k],
                    "padded_tokens": round(tokens[s][k] * padding),
                    "allreduce_wait_s": 0.01,
                    "compute_s": 0.1,
                }
                for s in range(total_steps if diverged_at is None else diverged_at + 1)
            ],
        )
    train = {
        "status": "ok" if diverged_at is None else "diverged",
        "train_s": train_s,
        "train_stage_s": train_s + 1.0,
        "tokens": int(sum(map(sum, tokens))),
        "tokens_per_s": sum(map(sum, tokens)) / train_s,
        "allreduce_wait_share": 0.2,
        "peak_mem_mb": 200.0,
        "resumed_from_step": 0,
        "total_steps": total_steps,
        "strategy": "ddp",
    }
    if diverged_at is not None:
        train["diverged_step"] = diverged_at
        train["diverged"] = {"what": "loss", "loss": ["nan"] * ws, "grad_norm": ["nan"] * ws}
    atomic_write_json(run_dir / "train.json", train)
    _marker(run_dir, "train", train, train_s + 1.0)
    if diverged_at is None:
        if stop("eval"):
            return run_dir
        scores: dict[str, Any] = {}
        if loss is not None:
            scores["heldout"] = {"loss": loss, "loss_stderr": 0.01, "perplexity": 2.718**loss, "n": 24}
        tasks: dict[str, Any] = {}
        if demo_items:  # the demo benchmark's items (repro/demo/tasks.py), all of one category
            n = len(demo_items)
            overall = {"value": sum(demo_items.values()) / n, "stderr": None, "n": n}
            tasks["demo"] = {
                "kind": "pool",
                "metric": "exact_or_exec",
                "max_new_tokens": 12,
                "scores": {"overall": overall},
            }
            atomic_write_jsonl(
                run_dir / "eval_samples.jsonl",
                [
                    {"id": i, "category": "overall", "score": v, "benchmark": "demo/overall"}
                    for i, v in demo_items.items()
                ],
            )
        ev = {
            "scores": scores,
            "tasks": tasks,
            "benchmarks": list(benchmarks),
            "eval_s": 5.0,
            "eval_settings": asdict(cfg.eval),
            "eval_hash": eval_hash(cfg),
        }
        _marker(run_dir, "eval", ev, 5.0)
    if stop("results"):
        return run_dir
    from repro.pipeline import stage_results

    res = stage_results(cfg, run_dir)
    _marker(run_dir, "results", {**res, "eval_hash": eval_hash(cfg)}, 0.1)
    return run_dir


def _settings(benchmarks: list[str], limit: int | None, protocol: str) -> Any:
    from evals.benchmarks import EvalSettings

    return EvalSettings(
        limit=limit, protocol={b: protocol for b in benchmarks} if protocol != "lm-eval" else {}
    )


def fake_eval(
    run_dir: Path, entries: list[dict[str, Any]], limit: int | None = None, protocol: str = "lm-eval"
) -> Path:
    """`cluster-repro eval --run RUN` of `entries` (their protocol), written as the command
    writes it: RUN/evals/<eval_id>/. Returns that folder."""
    from evals.cli import _run_base, eval_identity, write_evaluation

    cfg = load_config(run_dir / "config.yaml")
    benchmarks = [e["benchmark"] for e in entries]
    settings = _settings(benchmarks, limit, protocol)
    eval_id = eval_identity(benchmarks, settings)
    out = run_dir / EVALS_DIR / eval_id
    write_evaluation(out, _run_base(cfg), eval_id, benchmarks, settings, entries, {"limit": limit})
    return out


def fake_model_eval(
    root: Path, name: str, model: str, entries: list[dict[str, Any]], limit: int | None = None
) -> Path:
    """`cluster-repro eval --model MODEL --name NAME --out ROOT/eval/NAME` of `entries`."""
    from evals.cli import eval_identity, write_evaluation

    folder = root / "eval" / name
    base = {"run_id": f"eval-{name}", "name": name, "method": "base", "model": model}
    write_eval_record(folder, base["run_id"], {"model": model, "method": "base", "name": name})
    benchmarks = [e["benchmark"] for e in entries]
    settings = _settings(benchmarks, limit, "lm-eval")
    eval_id = eval_identity(benchmarks, settings)
    out = folder / EVALS_DIR / eval_id
    write_evaluation(out, base, eval_id, benchmarks, settings, entries, {"limit": limit})
    return out


def run_id_of(run_dir: Path) -> str:
    return str(json.loads((run_dir / "run.json").read_text())["run_id"])
