"""Run the paper's benchmarks on a model through lm-evaluation-harness and turn the results into
result entries (and tidy result rows), writing per-sample logs.

    entries = run_benchmarks(model, tokenizer, ["medqa", "humaneval"], EvalSettings(...), out_dir)

Benchmarks (`BENCHMARKS`): humaneval, humaneval_plus, mbpp, mbpp_plus (pass@1, greedy) and medqa,
medmcqa, pubmedqa, mmlu_medical (log-likelihood multiple choice, accuracy); aliases `code`,
`medical`, `all`. Each runs as the lm-eval task `<benchmark>_<source>` from evals/tasks/, where
source is `local` (files in a data directory) or `hub` (the harness's hub datasets).

Each benchmark is evaluated on its own, so one failing benchmark never hides the others: data
that cannot be found gives a `missing` entry and a loud banner on stderr, a crash an `error`
entry; nothing is skipped silently. Every entry carries lm-eval's version and the task's version.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import json
import math
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from evals import local_data
from repro.io import atomic_write_json, atomic_write_jsonl

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


@dataclass(frozen=True)
class Benchmark:
    name: str
    kind: str  # "code" or "medical"
    metrics: tuple[str, ...]  # lm-eval metric names reported as rows, the main one first
    harness_task: str  # the lm-eval 0.4.13 task it mirrors
    group: bool = False  # an lm-eval group of subtasks (mmlu_medical)


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("humaneval", "code", ("pass@1",), "humaneval"),
    Benchmark("humaneval_plus", "code", ("pass@1",), "humaneval_plus"),
    Benchmark("mbpp", "code", ("pass@1",), "mbpp"),
    Benchmark("mbpp_plus", "code", ("pass@1",), "mbpp_plus"),
    Benchmark("medqa", "medical", ("acc", "acc_norm"), "medqa_4options"),
    Benchmark("medmcqa", "medical", ("acc", "acc_norm"), "medmcqa"),
    Benchmark("pubmedqa", "medical", ("acc",), "pubmedqa"),
    Benchmark("mmlu_medical", "medical", ("acc",), "multimedqa's six mmlu_* subjects", True),
)}
ALIASES = {"code": [b for b, x in BENCHMARKS.items() if x.kind == "code"],
           "medical": [b for b, x in BENCHMARKS.items() if x.kind == "medical"],
           "all": list(BENCHMARKS)}
SOURCES = ("local", "hub")
# Local variants with a split (or fixed examples) for few-shot prompts.
LOCAL_SHOT_SOURCES = ("mmlu_medical", "mbpp", "mbpp_plus")


def _log(msg: str) -> None:
    print(f"[cluster-repro eval] {msg}", file=sys.stderr, flush=True)


def _loud(msg: str) -> None:
    bar = "!" * 78
    print(f"\n{bar}\n[cluster-repro eval] {msg}\n{bar}\n", file=sys.stderr, flush=True)


def expand_benchmarks(names: list[str] | str) -> list[str]:
    """Benchmark names and aliases (a list or a comma-separated string) -> benchmark names, in
    order, without duplicates. An unknown name raises ValueError with a suggestion."""
    if isinstance(names, str):
        names = [n for n in names.split(",")]
    out: list[str] = []
    for raw in names:
        n = raw.strip()
        if not n:
            continue
        if n in ALIASES:
            out += ALIASES[n]
        elif n in BENCHMARKS:
            out.append(n)
        else:
            near = difflib.get_close_matches(n, [*BENCHMARKS, *ALIASES], n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"unknown benchmark {n!r}{hint} (known: {', '.join(BENCHMARKS)}; "
                             f"aliases: {', '.join(ALIASES)})")
    return list(dict.fromkeys(out))


@dataclass
class EvalSettings:
    """How to evaluate. `num_fewshot`: per-benchmark shot counts (default: the task's, which is
    the harness default: 0, or 3 for MBPP). `max_gen_toks`: cap on generated tokens for the code
    tasks (default: the task's: 1024 HumanEval, 256 MBPP); `limit`: first N items per task;
    `items`: only these item indices (0-based, in the task's order) of a benchmark, instead of
    `limit` (not for the grouped mmlu_medical)."""

    source: str = "local"
    data_dir: str | None = None
    limit: int | None = None
    batch_size: int = 8
    num_fewshot: dict[str, int] = field(default_factory=dict)
    max_gen_toks: int | None = None
    humaneval_plus_file: str | None = None
    bootstrap_iters: int = 1000
    seed: int = 1234
    items: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        for b, ids in self.items.items():
            if b not in BENCHMARKS or b == "mmlu_medical":
                raise ValueError(f"items: {b!r} is not a single-task benchmark; expected one of "
                                 f"{', '.join(x for x in BENCHMARKS if x != 'mmlu_medical')}")
            if not ids or any(not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"items: {b} needs item indices >= 0, got {ids!r}")
        for b, k in self.num_fewshot.items():
            if b not in BENCHMARKS:
                raise ValueError(f"num_fewshot: unknown benchmark {b!r}")
            if self.source == "local" and k and b not in LOCAL_SHOT_SOURCES:
                # lm-eval would draw shots from the test split itself when a task has no
                # training split: refuse rather than leak.
                raise ValueError(f"num_fewshot: {b} has no local split to draw shots from "
                                 f"(only {', '.join(LOCAL_SHOT_SOURCES)} do); use 0 or the hub")


def lm_eval_version() -> str:
    return metadata.version("lm_eval")


def make_lm(model: Any, tokenizer: Any, batch_size: int = 8, max_length: int | None = None):
    """Wrap an in-memory causal LM for lm-eval. A peft LoRA model is merged first (exact up to
    float rounding), since the harness wants a plain transformers model."""
    from lm_eval.models.huggingface import HFLM

    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.eval()
    kwargs = {"max_length": max_length} if max_length else {}
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, **kwargs)


def task_manager(settings: EvalSettings):
    """lm-eval's TaskManager over evals/tasks only (not the harness's ~10k built-in YAMLs)."""
    data_dir = local_data.resolve_data_dir(settings.data_dir)
    return _task_manager(str(data_dir) if data_dir else None, settings.humaneval_plus_file)


@functools.lru_cache(maxsize=8)
def _task_manager(data_dir: str | None, humaneval_plus_file: str | None):
    from lm_eval.tasks import TaskManager

    meta = {"data_dir": data_dir, "humaneval_plus_file": humaneval_plus_file}
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=meta)


@contextlib.contextmanager
def _without_env_info():
    """simple_evaluate's add_env_info runs `pip list` through torch's collect_env (about 2 s a
    call); our rows carry their own provenance (repro.results.provenance), so skip it."""
    import lm_eval.evaluator as ev

    saved = ev.add_env_info
    ev.add_env_info = lambda results: None
    try:
        yield
    finally:
        ev.add_env_info = saved


def _num(x: Any) -> float | None:
    if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)):
        return float(x)
    return None  # lm-eval writes "N/A" when a stderr cannot be computed


def _entries_from_results(bench: Benchmark, task: str, res: dict[str, Any], seconds: float,
                          settings: EvalSettings, fewshot: int | None) -> list[dict[str, Any]]:
    versions = res.get("versions", {})
    n_samples = res.get("n-samples", {})
    common = {"source": settings.source, "lm_eval_version": lm_eval_version(),
              "limit": settings.limit, "num_fewshot": fewshot, "seconds": round(seconds, 3),
              **({"items": settings.items[bench.name]} if bench.name in settings.items else {}),
              **({"max_gen_toks": settings.max_gen_toks}
                 if settings.max_gen_toks and bench.kind == "code" else {}),
              "status": "ok", "reason": None, "harness_task": bench.harness_task}
    out = []
    subtasks = [t for t in res["results"] if t != task] if bench.group else []
    n_total = (sum(n_samples[t]["effective"] for t in subtasks) if bench.group
               else n_samples[task]["effective"])
    for metric in bench.metrics:
        r = res["results"][task]
        out.append({**common, "benchmark": bench.name, "task": task,
                    "task_version": str(versions.get(task)), "metric": metric,
                    "value": _num(r.get(f"{metric},none")),
                    "stderr": _num(r.get(f"{metric}_stderr,none")), "n": n_total})
    for t in sorted(subtasks):  # mmlu_medical/<subject>
        r = res["results"][t]
        subject = t[len("mmlu_medical_"):-len(task[len("mmlu_medical"):])]
        out.append({**common, "benchmark": f"{bench.name}/{subject}", "task": t,
                    "task_version": str(versions.get(t)), "metric": "acc",
                    "value": _num(r.get("acc,none")), "stderr": _num(r.get("acc_stderr,none")),
                    "n": n_samples[t]["effective"]})
    return out


def _unreachable(e: BaseException) -> bool:
    """The hub dataset cannot be fetched (offline, no network, unknown id)."""
    names = {"DatasetNotFoundError", "OfflineModeIsEnabled", "LocalEntryNotFoundError",
             "RepositoryNotFoundError"}
    return isinstance(e, ConnectionError) or type(e).__name__ in names


def _status_entry(bench: str, task: str, status: str, reason: str, settings: EvalSettings,
                  seconds: float = 0.0) -> dict[str, Any]:
    return {"benchmark": bench, "task": task, "task_version": None, "metric": status,
            "value": None, "stderr": None, "n": 0, "source": settings.source,
            "lm_eval_version": lm_eval_version(), "limit": settings.limit, "num_fewshot": None,
            "seconds": round(seconds, 3), "status": status, "reason": reason,
            "harness_task": BENCHMARKS[bench].harness_task}


def _write_samples(path: Path, samples: list[dict[str, Any]]) -> None:
    rows = []
    for s in samples:
        rows.append({k: s.get(k) for k in ("doc_id", "doc", "target", "arguments", "resps",
                                             "filtered_resps", "filter")}
                    | {k: v for k, v in s.items() if k not in {
                        "doc_id", "doc", "target", "arguments", "resps", "filtered_resps",
                        "filter", "doc_hash", "prompt_hash", "target_hash"}})
    atomic_write_jsonl(path, json.loads(json.dumps(rows, default=str)))


def _settings_json(settings: EvalSettings) -> dict[str, Any]:
    return json.loads(json.dumps(vars(settings) | {"num_fewshot": settings.num_fewshot}))


def _finished(out_dir: Path | None, settings: EvalSettings, resume_key: str | None
              ) -> dict[str, list[dict[str, Any]]]:
    """Benchmark -> its entries from an earlier, interrupted or finished, call with the same
    resume_key, settings and lm-eval version (scored benchmarks only: missing and failed ones
    are tried again)."""
    path = None if out_dir is None or resume_key is None else Path(out_dir) / "benchmarks.json"
    if path is None or not path.is_file():
        return {}
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if (old.get("resume_key") != resume_key or old.get("settings") != _settings_json(settings)
            or old.get("lm_eval_version") != lm_eval_version()):
        return {}
    done: dict[str, list[dict[str, Any]]] = {}
    for e in old.get("entries", []):
        if e.get("status") == "ok":
            done.setdefault(str(e["benchmark"]).split("/")[0], []).append(e)
    return done


def run_benchmarks(lm: Any, benchmarks: list[str], settings: EvalSettings,
                   out_dir: Path | None = None, resume_key: str | None = None
                   ) -> list[dict[str, Any]]:
    """Evaluate `lm` (an lm-eval LM, e.g. from make_lm) on each benchmark; return entries
    (benchmark, metric, value, stderr, n, task, task_version, lm_eval_version, status, reason,
    seconds, ...). With out_dir: per-sample logs in out_dir/samples/<task>.jsonl and the entries
    so far in out_dir/benchmarks.json, rewritten (atomically) after every benchmark ("complete"
    says whether the call finished). With out_dir and a `resume_key` (what identifies the model:
    the CLI uses the model, adapter or run), a call that finds that file from an earlier call with
    the same key, settings and lm-eval version reuses its scored benchmarks instead of running
    them again: a killed evaluation keeps its finished benchmarks."""
    import lm_eval

    names = expand_benchmarks(benchmarks)
    tm = task_manager(settings)
    entries: list[dict[str, Any]] = []
    done = _finished(out_dir, settings, resume_key)

    def save(complete: bool) -> None:
        if out_dir is not None:
            atomic_write_json(Path(out_dir) / "benchmarks.json", {
                "entries": entries, "settings": _settings_json(settings),
                "lm_eval_version": lm_eval_version(), "resume_key": resume_key,
                "complete": complete})

    for name in names:
        bench = BENCHMARKS[name]
        if name in done:
            entries += done[name]
            _log(f"{name}: reusing the scores of an earlier call in {out_dir}/benchmarks.json")
            continue
        task = f"{name}_{settings.source}"
        t0 = time.perf_counter()
        if settings.source == "local":
            try:
                local_data.locate(name, settings.data_dir, settings.humaneval_plus_file)
            except local_data.MissingDataError as e:
                _loud(f"MISSING benchmark {name}: {e}")
                entries.append(_status_entry(name, task, "missing", str(e), settings))
                continue
        fewshot = settings.num_fewshot.get(name)
        gen_kwargs = ({"max_gen_toks": settings.max_gen_toks}
                      if settings.max_gen_toks and bench.kind == "code" else None)
        ids = settings.items.get(name)
        _log(f"{name}: lm-eval task {task}, "
             + (f"items {ids}" if ids else f"limit {settings.limit}") + ", batch "
             f"{getattr(lm, 'batch_size', '?')}"
             + (f", {fewshot} shots" if fewshot is not None else "")
             + (f", max_gen_toks {settings.max_gen_toks}" if gen_kwargs else ""))
        try:
            with _without_env_info():
                res = lm_eval.simple_evaluate(
                    model=lm, tasks=[task], task_manager=tm,
                    limit=None if ids else settings.limit, samples={task: ids} if ids else None,
                    num_fewshot=fewshot, gen_kwargs=gen_kwargs, log_samples=out_dir is not None,
                    confirm_run_unsafe_code=True, bootstrap_iters=settings.bootstrap_iters,
                    random_seed=settings.seed, numpy_random_seed=settings.seed,
                    torch_random_seed=settings.seed, fewshot_random_seed=settings.seed)
        except local_data.MissingDataError as e:
            _loud(f"MISSING benchmark {name}: {e}")
            entries.append(_status_entry(name, task, "missing", str(e), settings,
                                         time.perf_counter() - t0))
            continue
        except Exception as e:  # noqa: BLE001 - reported as a row, loudly, then go on
            if settings.source == "hub" and _unreachable(e):
                _loud(f"MISSING benchmark {name}: hub data unreachable: {e}")
                entries.append(_status_entry(name, task, "missing", f"hub data unreachable: {e}",
                                             settings, time.perf_counter() - t0))
                continue
            _loud(f"ERROR in benchmark {name} ({task}): {type(e).__name__}: {e}")
            entries.append(_status_entry(name, task, "error", f"{type(e).__name__}: {e}",
                                         settings, time.perf_counter() - t0))
            continue
        seconds = time.perf_counter() - t0
        nshot = res.get("n-shot", {})
        shots = nshot.get(task, next((v for k, v in nshot.items() if k != task), fewshot))
        got = _entries_from_results(bench, task, res, seconds, settings, shots)
        entries += got
        if out_dir is not None:
            for t, samples in (res.get("samples") or {}).items():
                _write_samples(Path(out_dir) / "samples" / f"{t}.jsonl", samples)
        main = got[0]
        _log(f"{name}: {main['metric']} = {main['value']:.4f} (n={main['n']}) in {seconds:.1f}s")
        save(complete=False)
    save(complete=True)
    return entries


def entries_to_rows(entries: list[dict[str, Any]], base: dict[str, Any]) -> list[dict[str, Any]]:
    """Tidy result rows (repro/results.py COLUMNS) from entries. The row's `versions` JSON gains
    the lm-eval task, its version, the source and settings (and the reason of a missing row)."""
    rows = []
    pkg = json.loads(base.get("versions") or "{}")
    for e in entries:
        v = {**pkg, "lm_eval": e["lm_eval_version"], "lm_eval_task": e["task"],
             "lm_eval_task_version": e["task_version"], "eval_source": e["source"],
             "eval_limit": e["limit"], "num_fewshot": e["num_fewshot"]}
        if e.get("items"):
            v["eval_items"] = e["items"]
        if e.get("max_gen_toks"):  # a capped code score must not pass for the task's own
            v["eval_max_gen_toks"] = e["max_gen_toks"]
        if e["reason"]:
            v["status_reason"] = e["reason"]
        rows.append({**base, "benchmark": e["benchmark"], "metric": e["metric"],
                     "value": e["value"], "stderr": e["stderr"], "n": e["n"],
                     "versions": json.dumps(v, sort_keys=True)})
    return rows
