"""Entries and rows: a benchmark's entries (one per metric, with its status, versions and
settings) from its per-item results, the entry of a benchmark that did not run, and the tidy
result rows (repro/core/results.py COLUMNS) made from entries.
"""

from __future__ import annotations

import json
import math
from typing import Any

from evals import harness
from evals.benchmarks import EvalSettings
from evals.plugins import Benchmark
from repro.core.protocols import DEFAULT_PROTOCOL


def _num(x: Any) -> float | None:
    if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)):
        return float(x)
    return None


def _task_score(
    samples: list[dict[str, Any]], metric: str, bootstrap_iters: int
) -> tuple[float, float | None, int]:
    """(mean, its standard error, n) of one metric over a task's items, in doc order, with
    lm-eval's own functions (mean, mean_stderr: the sample standard deviation / sqrt(n)); no
    stderr for one item or with bootstrap_iters 0, as lm-eval. Items scored NaN (a code task
    whose canonical solution never finished, evals/task_functions.py) are left out."""
    values = [s[metric] for s in samples if _num(s[metric]) is not None]
    if not values:
        return math.nan, None, 0
    value, stderr = harness.mean_and_stderr(values, len(values) > 1 and bootstrap_iters > 0)
    return value, _num(stderr), len(values)


def _unscored_tasks(samples: list[dict[str, Any]], metric: str) -> list[str]:
    """The task ids of the items a metric left out (scored NaN)."""
    return [
        str((s.get("doc") or {}).get("task_id", s.get("doc_id")))
        for s in samples
        if metric in s and _num(s[metric]) is None
    ]


def data_entry_fields(bench: Benchmark, settings: EvalSettings) -> dict[str, Any]:
    """A code benchmark's data file as its entry records it (`data`: file, version, tasks,
    sha256; evals/evalplus/data.py), or nothing for other benchmarks and the hub's data (whose
    version is the hub dataset the lm-eval task names)."""
    from evals.benchmarks import CODE_BENCHMARKS

    if bench.name not in CODE_BENCHMARKS or settings.source != "local":
        return {}
    from evals.evalplus.data import code_data_info

    return {
        "data": code_data_info(
            bench.name, settings.data_dir, settings.humaneval_plus_file, settings.evalplus_version
        )
    }


def entries_from_items(
    bench: Benchmark,
    task: str,
    samples: dict[str, list[dict[str, Any]]],
    order: list[str],
    info: dict[str, Any],
    settings: EvalSettings,
    seconds: float,
) -> list[dict[str, Any]]:
    """The entries of one benchmark from the per-item results of all its tasks (each list sorted
    by doc_id). A group (mmlu_medical) pools its subjects as lm-eval does: the size-weighted mean
    of the subject means, and the pooled standard error."""

    versions, nshot = info.get("versions", {}), info.get("n_shot", {})
    shots = nshot.get(
        task, next((v for k, v in nshot.items() if k != task), settings.num_fewshot.get(bench.name))
    )
    gen_toks = next(iter(info.get("gen_toks", {}).values()), None)
    common = {
        "source": settings.source,
        "lm_eval_version": harness.lm_eval_version(),
        "limit": settings.limit,
        "num_fewshot": shots,
        "seconds": round(seconds, 3),
        **({"items": settings.items[bench.name]} if bench.name in settings.items else {}),
        **({"max_gen_toks": gen_toks} if gen_toks else {}),
        "status": "ok",
        "reason": None,
        "harness_task": bench.harness_task,
        "protocol": settings.protocol_of(bench.name),
        **data_entry_fields(bench, settings),
    }
    if not bench.group and task in samples:
        from evals.evalplus.check import excluded_tasks_note

        common.update(excluded_tasks_note(_unscored_tasks(samples[task], bench.metrics[0])))
    leaf = {
        t: {m: _task_score(samples[t], m, settings.bootstrap_iters) for m in bench.metrics} for t in order
    }
    out = []
    for metric in bench.metrics:
        if bench.group:
            scores = [leaf[t][metric] for t in order]
            sizes = [n for _, _, n in scores]
            value, stderr = harness.pool_group([v for v, _, _ in scores], sizes, [e for _, e, _ in scores])
            n = sum(sizes)
        else:
            value, stderr, n = leaf[task][metric]
        out.append(
            {
                **common,
                "benchmark": bench.name,
                "kind": bench.kind,
                "task": task,
                "task_version": str(versions.get(task)),
                "metric": metric,
                "value": value,
                "stderr": stderr,
                "n": n,
            }
        )
    if bench.group:
        for t in sorted(order):  # mmlu_medical/<subject>
            subject = t[len("mmlu_medical_") : -len(task[len("mmlu_medical") :])]
            value, stderr, n = leaf[t]["acc"]
            out.append(
                {
                    **common,
                    "benchmark": f"{bench.name}/{subject}",
                    "task": t,
                    "task_version": str(versions.get(t)),
                    "metric": "acc",
                    "value": value,
                    "stderr": stderr,
                    "n": n,
                }
            )
    return out


def status_entry(
    bench: Benchmark, task: str, status: str, reason: str, settings: EvalSettings, seconds: float = 0.0
) -> dict[str, Any]:
    return {
        "benchmark": bench.name,
        "kind": bench.kind,
        "task": task,
        "task_version": None,
        "metric": status,
        "value": None,
        "stderr": None,
        "n": 0,
        "source": settings.source,
        "lm_eval_version": harness.lm_eval_version(),
        "limit": settings.limit,
        "num_fewshot": None,
        "seconds": round(seconds, 3),
        "status": status,
        "reason": reason,
        "harness_task": bench.harness_task,
        "protocol": settings.protocol_of(bench.name),
    }


def entries_to_rows(entries: list[dict[str, Any]], base: dict[str, Any]) -> list[dict[str, Any]]:
    """Tidy result rows (repro/core/results.py COLUMNS) from entries. The row's `versions` JSON gains
    the lm-eval task, its version, the source and settings (and the reason of a missing row), and
    for a benchmark's own rows its kind (`benchmark_kind`: what the reports group it under, which
    they read from the rows alone)."""
    rows = []
    pkg = json.loads(base.get("versions") or "{}")
    for e in entries:
        v = {
            **pkg,
            "lm_eval": e["lm_eval_version"],
            "lm_eval_task": e["task"],
            "lm_eval_task_version": e["task_version"],
            "eval_source": e["source"],
            "eval_limit": e["limit"],
            "num_fewshot": e["num_fewshot"],
        }
        if e.get("items"):
            v["eval_items"] = e["items"]
        if e.get("max_gen_toks"):  # the limit a code benchmark generated under (tokens)
            v["eval_max_gen_toks"] = e["max_gen_toks"]
        for key in ("evalplus_version", "evalplus_dataset", "template", "oracle_failed_tasks"):
            if e.get(key) is not None:  # the evalplus protocol's package, problems and template
                v[f"eval_{key}" if not key.startswith("evalplus") else key] = e[key]
        if e.get("data"):  # a code benchmark's data file: name, version, task count, sha256
            v.update({f"eval_data_{k}": x for k, x in e["data"].items()})
        for key in ("excluded_tasks", "note"):  # tasks left out of the score, and why
            if e.get(key):
                v[f"eval_{key}"] = e[key]
        if e.get("kind"):  # not on mmlu_medical/<subject> rows: a subject is no benchmark
            v["benchmark_kind"] = e["kind"]
        if e["reason"]:
            v["status_reason"] = e["reason"]
        rows.append(
            {
                **base,
                "benchmark": e["benchmark"],
                "metric": e["metric"],
                "value": e["value"],
                "stderr": e["stderr"],
                "n": e["n"],
                "eval_protocol": e.get("protocol", DEFAULT_PROTOCOL),
                "versions": json.dumps(v, sort_keys=True),
            }
        )
    return rows
