"""A run's scores in lm-evaluation-harness's results JSON shape, for tools that read lm-eval output.

Written beside the result rows, as `<run_dir>/lm_eval_results.json` by the pipeline's results stage
and `<output_dir>/lm_eval_results.json` by `cluster-repro eval`. Built from the result rows alone
(repro/core/results.py), so its numbers are the rows' numbers:

    {"results": {"medqa_local": {"alias": "medqa", "acc,none": 0.31, "acc_stderr,none": 0.013,
                                 "acc_norm,none": ..., "acc_norm_stderr,none": ...},
                 "heldout": {"alias": "heldout", "loss,none": 1.92, ...}, ...},
     "groups": {"mmlu_medical_local": {...}}, "group_subtasks": {"mmlu_medical_local": [...]},
     "versions": {"medqa_local": "1.0"}, "n-shot": {"medqa_local": 0},
     "n-samples": {"medqa_local": {"effective": 1273}},
     "config": {"model": ..., "batch_size": 8, "limit": null, ...},
     "lm_eval_version": "0.4.13", "git_hash": ..., "date": <Unix time>,
     "cluster_repro": {run_id, config_hash, method, ..., costs, status, versions, not_evaluated}}

Task names: a benchmark's lm-eval task (`medqa_local`, `mmlu_medical_anatomy_local`); the suite's
own scores (held-out loss, demo tasks) under their benchmark name. The filter is always `none`:
the suite scores lm-eval's unfiltered responses (evals/run.py). A standard error that was not
computed is "N/A", as lm-eval writes it. Benchmarks that could not be scored (missing data, an
error) are not in `results` but in `cluster_repro.not_evaluated` with the reason; a diverged run
has no results. Diagnostic rows (costs, clusters, workers) stay in the CSV only.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from repro.core.io import atomic_write_json
from repro.core.results import COLUMNS, DIAGNOSTIC_PREFIXES, package_versions

LM_EVAL_NAME = "lm_eval_results.json"
FILTER = "none"
# Columns that differ from row to row; every other column describes the whole run.
_PER_ROW = ("benchmark", "metric", "value", "stderr", "n", "versions")


def _is_score(row: dict[str, Any]) -> bool:
    return (
        row["value"] is not None
        and row.get("status") != "diverged"
        and not str(row["benchmark"]).startswith(DIAGNOSTIC_PREFIXES)
    )


def lm_eval_results(rows: list[dict[str, Any]], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The lm-eval-shaped results of one run's (or one `cluster-repro eval` call's) rows.
    `config`: more entries for the "config" section (the rows give the model and, for a run,
    its eval settings)."""
    results: dict[str, dict[str, Any]] = {}
    versions: dict[str, Any] = {}
    n_shot: dict[str, Any] = {}
    n_samples: dict[str, dict[str, int]] = {}
    task_of: dict[str, str] = {}  # benchmark -> task name
    not_evaluated: dict[str, dict[str, Any]] = {}
    for row in rows:
        bench = str(row["benchmark"])
        v = json.loads(row.get("versions") or "{}")
        if row["value"] is None and not bench.startswith(DIAGNOSTIC_PREFIXES):
            not_evaluated[bench] = {"status": row["metric"], "reason": v.get("status_reason")}
            continue
        if not _is_score(row):
            continue
        task = v.get("lm_eval_task") or bench
        task_of[bench] = task
        entry = results.setdefault(task, {"alias": bench})
        entry[f"{row['metric']},{FILTER}"] = row["value"]
        entry[f"{row['metric']}_stderr,{FILTER}"] = "N/A" if row["stderr"] is None else row["stderr"]
        if "lm_eval_task_version" in v:
            versions[task] = v["lm_eval_task_version"]
        if v.get("num_fewshot") is not None:
            n_shot[task] = v["num_fewshot"]
        if row.get("n") is not None:
            n_samples[task] = {"effective": int(row["n"])}
    subtasks: dict[str, list[str]] = {}
    for bench, task in task_of.items():  # "mmlu_medical/anatomy" is a subtask of mmlu_medical
        parent = bench.rpartition("/")[0]
        if parent in task_of:
            subtasks.setdefault(task_of[parent], []).append(task)
    first = rows[0] if rows else {}
    run = {c: first.get(c) for c in COLUMNS if c not in _PER_ROW and c in first}
    installed = package_versions()
    pkgs = {k: v for k, v in json.loads(first.get("versions") or "{}").items() if k in installed}
    settings = json.loads(first.get("eval_settings") or "{}")
    out: dict[str, Any] = {
        "results": results,
        "group_subtasks": subtasks,
        "versions": versions,
        "n-shot": n_shot,
        "n-samples": n_samples,
        "config": {"model": first.get("model"), **settings, **(config or {})},
        "lm_eval_version": pkgs.get("lm_eval"),
        "git_hash": first.get("git_sha"),
        "date": (
            dt.datetime.fromisoformat(first["timestamp"]).timestamp() if first.get("timestamp") else None
        ),
        "cluster_repro": {**run, "versions": pkgs, "not_evaluated": not_evaluated},
    }
    if subtasks:
        out["groups"] = {group: results[group] for group in subtasks}
    return out


def write_lm_eval_results(
    path: Path, rows: list[dict[str, Any]], config: dict[str, Any] | None = None
) -> None:
    """lm_eval_results(rows, config) to `path`, atomically."""
    atomic_write_json(path, lm_eval_results(rows, config))
