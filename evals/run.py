"""Run the paper's benchmarks on a model through lm-evaluation-harness and turn the results into
result entries (and tidy result rows), writing per-sample logs.

    entries = run_benchmarks(make_lm(model, tok), ["medqa", "humaneval"], EvalSettings(...), out_dir)

Benchmarks (`BENCHMARKS`): humaneval, humaneval_plus, mbpp, mbpp_plus (pass@1, greedy) and medqa,
medmcqa, pubmedqa, mmlu_medical (log-likelihood multiple choice, accuracy); aliases `code`,
`medical`, `all`. Each runs as the lm-eval task `<benchmark>_<source>` from evals/tasks/, where
source is `local` (files in a data directory) or `hub` (the harness's hub datasets). More
benchmarks come from folders of task YAMLs (`EvalSettings.task_paths`) and installed packages
(evals/plugins.py); `known_benchmarks` lists them all.

Each benchmark is evaluated on its own, so one failing benchmark never hides the others: data
that cannot be found gives a `missing` entry and a loud banner on stderr, a crash an `error`
entry; nothing is skipped silently. Every entry carries lm-eval's version and the task's version.

Several processes can evaluate together (evals/parallel.py starts them, one per GPU): every
process scores its share of each benchmark's items (`_my_items`: items i, i + P, i + 2P, ... for
process i of P) through lm-eval's `samples` argument, and process 0 gathers the per-item results
and computes the entries from them (`_entries_from_items`, with lm-eval's own metric functions).
A lone process takes the same path with all the items, so the entries do not depend on how many
processes scored the items, only on the items' scores.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from evals import local_data, plugins
from evals.plugins import Benchmark
from repro.core.config import resolve_data_dir
from repro.core.io import atomic_write_json, atomic_write_jsonl
from repro.core.log import get_logger, progress_bar

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("humaneval", "code", ("pass@1",), "humaneval"),
        Benchmark("humaneval_plus", "code", ("pass@1",), "humaneval_plus"),
        Benchmark("mbpp", "code", ("pass@1",), "mbpp"),
        Benchmark("mbpp_plus", "code", ("pass@1",), "mbpp_plus"),
        Benchmark("medqa", "medical", ("acc", "acc_norm"), "medqa_4options"),
        Benchmark("medmcqa", "medical", ("acc", "acc_norm"), "medmcqa"),
        Benchmark("pubmedqa", "medical", ("acc",), "pubmedqa"),
        Benchmark("mmlu_medical", "medical", ("acc",), "multimedqa's six mmlu_* subjects", True),
    )
}
ALIASES = {
    "code": [b for b, x in BENCHMARKS.items() if x.kind == "code"],
    "medical": [b for b, x in BENCHMARKS.items() if x.kind == "medical"],
    "all": list(BENCHMARKS),
}
# The benchmarks that generate text (greedy, up to a token limit); the others score choices.
CODE_BENCHMARKS = tuple(ALIASES["code"])
SOURCES = ("local", "hub")
# Local variants with a split (or fixed examples) for few-shot prompts.
LOCAL_SHOT_SOURCES = ("mmlu_medical", "mbpp", "mbpp_plus")


logger = get_logger("eval")


def _loud(msg: str) -> None:
    """A warning no one scrolling a log can miss: the message between two rows of '!'."""
    bar = "!" * 78
    logger.warning(f"{bar}\n{msg}\n{bar}")


@functools.lru_cache(maxsize=1)
def _builtin_tasks() -> frozenset[str]:
    """The lm-eval task and group names evals/tasks defines (a plugin may not take one)."""
    return frozenset(plugins.task_yamls(TASKS_DIR)) | {f"{b}_{s}" for b in BENCHMARKS for s in SOURCES}


def known_benchmarks(task_paths: Iterable[str] = ()) -> dict[str, Benchmark]:
    """Every benchmark by name: the eight built-in ones, then those of installed packages and of
    the `task_paths` folders (evals/plugins.py; BenchmarkPluginError if one is unusable)."""
    reserved = {*BENCHMARKS, *ALIASES, *_builtin_tasks()}
    return {**BENCHMARKS, **plugins.plugin_benchmarks(task_paths, reserved)}


def expand_benchmarks(names: list[str] | str, task_paths: Iterable[str] = ()) -> list[str]:
    """Benchmark names and aliases (a list or a comma-separated string) -> benchmark names, in
    order, without duplicates. Plugin benchmarks (of installed packages and the `task_paths`
    folders) are known by name; the aliases name the built-in ones. An unknown name raises
    ValueError with a suggestion: the nearest known name, or for lm-eval's own task name
    (medqa_4options) this suite's (medqa). The eval CLI, the eval stage and the preflight check
    (repro/preflight.py) all read names through here."""
    if isinstance(names, str):
        names = [n for n in names.split(",")]
    known = known_benchmarks(task_paths)
    out: list[str] = []
    for raw in names:
        n = raw.strip()
        if not n:
            continue
        if n in ALIASES:
            out += ALIASES[n]
        elif n in known:
            out.append(n)
        else:
            by_harness = {b.harness_task: name for name, b in BENCHMARKS.items()}
            near = difflib.get_close_matches(n, [*known, *ALIASES], n=1, cutoff=0.5)
            hint = (
                f"; did you mean {by_harness[n]!r} (this suite's name for lm-eval's {n})?"
                if n in by_harness
                else f"; did you mean {near[0]!r}?"
                if near
                else ""
            )
            raise ValueError(
                f"unknown benchmark {n!r}{hint} (known: {', '.join(known)}; "
                f"aliases: {', '.join(ALIASES)}; more from eval.task_paths or an "
                "installed package: docs/add-a-benchmark.md)"
            )
    return list(dict.fromkeys(out))


@dataclass
class EvalSettings:
    """How to evaluate. `num_fewshot`: per-benchmark shot counts (default: the task's, which is
    the harness default: 0, or 3 for MBPP). `max_gen_toks`: the limit on generated tokens of the
    code benchmarks, one number for all or a mapping per benchmark (default, or a benchmark the
    mapping leaves out: the task's own, 1024 HumanEval(+), 256 MBPP(+)); `limit`: first N items
    per task; `items`: only these item indices (0-based, in the task's order) of a benchmark,
    instead of `limit` (not for the grouped mmlu_medical). `task_paths`: folders of lm-eval task
    YAMLs whose tasks are benchmarks too (evals/plugins.py)."""

    source: str = "local"
    data_dir: str | None = None
    limit: int | None = None
    batch_size: int = 8
    num_fewshot: dict[str, int] = field(default_factory=dict)
    max_gen_toks: int | dict[str, int] | None = None
    humaneval_plus_file: str | None = None
    bootstrap_iters: int = 1000
    seed: int = 1234
    items: dict[str, list[int]] = field(default_factory=dict)
    task_paths: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.data_dir is not None:  # a Path (a run's data_dir) too; saved as JSON
            self.data_dir = str(self.data_dir)
        self.task_paths = [str(p) for p in self.task_paths]
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        known = known_benchmarks(self.task_paths) if self.items or self.num_fewshot else {}
        single = [x for x, b in known.items() if not b.group]
        for b, ids in self.items.items():
            if b not in single:
                raise ValueError(
                    f"items: {b!r} is not a single-task benchmark; expected one of {', '.join(single)}"
                )
            if not ids or any(not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"items: {b} needs item indices >= 0, got {ids!r}")
        for b, k in self.num_fewshot.items():
            if b not in known:
                raise ValueError(f"num_fewshot: unknown benchmark {b!r}")
            if self.source == "local" and k and b in BENCHMARKS and b not in LOCAL_SHOT_SOURCES:
                # lm-eval would draw shots from the test split itself when a task has no
                # training split: refuse rather than leak.
                raise ValueError(
                    f"num_fewshot: {b} has no local split to draw shots from "
                    f"(only {', '.join(LOCAL_SHOT_SOURCES)} do); use 0 or the hub"
                )
        limits = (
            self.max_gen_toks
            if isinstance(self.max_gen_toks, dict)
            else {}
            if self.max_gen_toks is None
            else {"": self.max_gen_toks}
        )
        for b, n in limits.items():
            if b and b not in CODE_BENCHMARKS:
                raise ValueError(
                    f"max_gen_toks: {b!r} is not a generation benchmark (expected "
                    f"{', '.join(CODE_BENCHMARKS)})"
                )
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(
                    f"max_gen_toks{'.' + b if b else ''}: expected a positive number of tokens, got {n!r}"
                )
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit: expected a number of items >= 1, got {self.limit}")

    def gen_limit(self, benchmark: str) -> int | None:
        """The generation limit stated for `benchmark`, or None (the task's own applies; a
        plugin's task YAML sets its own)."""
        if benchmark not in CODE_BENCHMARKS:
            return None
        if isinstance(self.max_gen_toks, dict):
            return self.max_gen_toks.get(benchmark)
        return self.max_gen_toks


def lm_eval_version() -> str:
    return metadata.version("lm_eval")


def make_lm(
    model: Any, tokenizer: Any, batch_size: int = 8, max_length: int | None = None, dtype: Any = None
):
    """Wrap an in-memory causal LM for lm-eval. A peft LoRA model is merged first (exact up to
    float rounding), since the harness wants a plain transformers model; then the weights are
    cast to `dtype` when given (e.g. torch.bfloat16 on a GPU)."""
    from lm_eval.models.huggingface import HFLM

    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    if dtype is not None:
        model = model.to(dtype)
    model.eval()
    kwargs = {"max_length": max_length} if max_length else {}
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, **kwargs)


def task_manager(settings: EvalSettings, benches: Iterable[Benchmark] = ()):
    """lm-eval's TaskManager over evals/tasks and the plugin `benches`' task folders; the
    harness's ~10k built-in YAMLs only when a plugin names one of its tasks (no task folder)."""
    data_dir = resolve_data_dir(settings.data_dir)
    benches = [b for b in benches if b.plugin]
    dirs = tuple(dict.fromkeys(str(Path(b.task_dir).resolve()) for b in benches if b.task_dir))
    return _task_manager(
        str(data_dir) if data_dir else None,
        settings.humaneval_plus_file,
        dirs,
        any(b.task_dir is None for b in benches),
    )


@functools.lru_cache(maxsize=8)
def _task_manager(
    data_dir: str | None,
    humaneval_plus_file: str | None,
    plugin_dirs: tuple[str, ...] = (),
    harness_tasks: bool = False,
):
    from lm_eval.tasks import TaskManager

    meta = {"data_dir": data_dir, "humaneval_plus_file": humaneval_plus_file}
    return TaskManager(
        include_path=[str(TASKS_DIR), *plugin_dirs], include_defaults=harness_tasks, metadata=meta
    )


@contextlib.contextmanager
def _harness_as_one_process():
    """Run simple_evaluate as a plain single process, whatever this process's place in a group.

    - simple_evaluate's add_env_info runs `pip list` through torch's collect_env (about 2 s a
      call); our rows carry their own provenance (repro.core.results.provenance), so skip it.
    - simple_evaluate returns None (no results) where LOCAL_RANK is not 0, as torchrun and our
      SLURM jobs set it: the processes here share items themselves (`_my_items`), so each one is
      a whole lm-eval run of its own.
    """
    import lm_eval.evaluator as ev

    saved_env_info = ev.add_env_info
    saved_local_rank = os.environ.pop("LOCAL_RANK", None)
    ev.add_env_info = lambda results: None
    try:
        yield
    finally:
        ev.add_env_info = saved_env_info
        if saved_local_rank is not None:
            os.environ["LOCAL_RANK"] = saved_local_rank


@contextlib.contextmanager
def _harness_progress(benchmark: str, enabled: bool):
    """lm-eval's progress bars through ours (repro.core.log) while one benchmark runs.

    The model's request loops (lm_eval.models.huggingface: "Running loglikelihood requests", one
    request per item and answer choice; "Running generate_until requests", one per item) become
    `<benchmark> <kind>: done/total requests` lines, or a bar on a terminal; the quick passes that
    build and tokenize the requests (lm_eval.api.task, lm_eval.api.model) stay silent. Left to
    itself, lm-eval redraws tqdm bars with carriage returns, one line of thousands of characters
    in a log file. `enabled`: whether this process shows progress (process 0 of several)."""
    import lm_eval.api.model as api_model
    import lm_eval.api.task as api_task
    import lm_eval.models.huggingface as hf

    def requests_bar(
        iterable: Any = None,
        total: int | None = None,
        desc: str | None = None,
        disable: bool = False,
        **_: Any,
    ) -> Any:
        kind = (desc or "").removeprefix("Running ").removesuffix(" requests")
        return progress_bar(
            iterable,
            total=total,
            desc=f"{benchmark} {kind}".strip(),
            unit="requests",
            enabled=enabled and not disable,
            logger=logger,
        )

    def silent(iterable: Any = None, total: int | None = None, **_: Any) -> Any:
        return progress_bar(iterable, total=total, enabled=False)

    saved = [(m, m.tqdm) for m in (hf, api_model, api_task)]
    hf.tqdm, api_model.tqdm, api_task.tqdm = requests_bar, silent, silent
    try:
        yield
    finally:
        for module, original in saved:
            module.tqdm = original


# ----------------------------------------------------------------------------- processes

# How long a process waits at a collective for the others (gathering a benchmark's results):
# longer than any share takes, since the slowest process sets the pace; a process that dies
# ends the others anyway (spawn_workers' join, or srun --kill-on-bad-exit in a SLURM job).
COLLECTIVE_TIMEOUT_S = 24 * 3600


class Processes:
    """This process's place among the processes evaluating together, and the two collectives the
    evaluation needs: gather to process 0, and broadcast from it. Alone (the default): rank 0 of
    1, no torch.distributed. Together: a gloo group over all ranks of the initialized default
    group (gloo even beside NCCL: only Python objects travel, and its timeout is ours)."""

    def __init__(self, together: bool = False) -> None:
        self.rank, self.world, self.group = 0, 1, None
        if together:
            import datetime

            import torch.distributed as dist

            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self.group = dist.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
            )

    def gather(self, obj: Any) -> list[Any] | None:
        """Every process's `obj`, in rank order, on process 0; None on the others."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Process 0's `obj`, on every process."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


# ----------------------------------------------------------------------------- one benchmark


def _selected_items(bench: Benchmark, n_docs: int, settings: EvalSettings) -> list[int]:
    """The item indices of one task that the settings ask for, ascending: `items`, the first
    `limit`, or all. (Ascending: lm-eval's `samples` maps doc ids right only for sorted lists.)"""
    if bench.name in settings.items:
        ids = sorted(set(settings.items[bench.name]))
        bad = [i for i in ids if i >= n_docs]
        if bad:
            raise ValueError(f"items: {bench.name} has {n_docs} items (0 to {n_docs - 1}), got {bad}")
        return ids
    return list(range(min(settings.limit, n_docs) if settings.limit else n_docs))


def _shots_depend_on_order(tasks: dict[str, Any], fewshot: int | None) -> bool:
    """Whether an item's few-shot examples depend on which items were built before it: lm-eval's
    default sampler draws each item's shots from one random stream, so a process scoring a share
    would draw other shots than a lone process. The `first_n` sampler (MMLU dev rows, MBPP's
    fixed three) gives every item the same shots."""
    for t in tasks.values():
        configured = t.config.num_fewshot or 0
        shots = configured if configured == 0 or fewshot is None else fewshot
        sampler = getattr(t.config.fewshot_config, "sampler", None)
        if shots > 0 and sampler != "first_n":
            return True
    return False


def _my_items(
    bench: Benchmark, tasks: dict[str, Any], settings: EvalSettings, procs: Processes
) -> tuple[dict[str, list[int]], int]:
    """(this process's items of each task, how many processes share them). Items are dealt round
    robin (item i to process i mod P), which balances both counts and lengths (items of one task
    come in no length order). A benchmark whose shots depend on the order goes whole to process
    0, so its items get the shots a lone process would give them."""
    chosen = {name: _selected_items(bench, len(t.eval_docs), settings) for name, t in tasks.items()}
    if _shots_depend_on_order(tasks, settings.num_fewshot.get(bench.name)):
        return (chosen if procs.rank == 0 else {name: [] for name in chosen}), 1
    return {name: ids[procs.rank :: procs.world] for name, ids in chosen.items()}, procs.world


def _score_my_share(
    lm: Any, bench: Benchmark, task: str, tm: Any, settings: EvalSettings, procs: Processes
) -> dict[str, Any]:
    """This process's part of one benchmark: the per-item results of its share of the items.
    Never raises: a failure is a part with status "missing" or "error", so that every process
    still reaches the gather and process 0 reports it."""
    import lm_eval

    try:
        loaded = tm.load([task])
        tasks = loaded["tasks"]  # leaf task name -> Task, in the group's order
        mine, sharing = _my_items(bench, tasks, settings, procs)
        run = {name: ids for name, ids in mine.items() if ids}
        part: dict[str, Any] = {"status": "ok", "order": list(tasks), "sharing": sharing, "samples": {}}
        if not run:  # fewer items than processes: nothing for this one
            return part
        # Every task with items: the group itself (rank 0 always, having item 0 of each); a
        # task without items must be left out, as lm-eval reads an empty list as "all items".
        objs = (
            list(loaded["groups"].values())
            if bench.group and len(run) == len(tasks)
            else [tasks[name] for name in run]
        )
        limit = settings.gen_limit(bench.name)
        if procs.rank == 0:
            total = sum(len(_selected_items(bench, len(t.eval_docs), settings)) for t in tasks.values())
            here = sum(len(ids) for ids in run.values())
            logger.info(
                f"{bench.name}: {total} items"
                + (
                    f", {here} of them scored here and the rest by the other {procs.world - 1} "
                    "processes (the progress lines count this one's)"
                    if sharing > 1
                    else ""
                )
            )
        with _harness_as_one_process(), _harness_progress(bench.name, procs.rank == 0):
            res = lm_eval.simple_evaluate(
                model=lm,
                tasks=objs,
                task_manager=tm,
                samples=run,
                num_fewshot=settings.num_fewshot.get(bench.name),
                gen_kwargs={"max_gen_toks": limit} if limit else None,
                log_samples=True,
                confirm_run_unsafe_code=True,
                bootstrap_iters=settings.bootstrap_iters,
                random_seed=settings.seed,
                numpy_random_seed=settings.seed,
                torch_random_seed=settings.seed,
                fewshot_random_seed=settings.seed,
            )
        part.update(
            samples=res["samples"],
            versions=res.get("versions", {}),
            n_shot=res.get("n-shot", {}),
            gen_toks={
                name: (c.get("generation_kwargs") or {}).get("max_gen_toks")
                for name, c in res.get("configs", {}).items()
                if c.get("output_type") == "generate_until"
            },
        )
        return part
    except local_data.MissingDataError as e:
        return {"status": "missing", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - reported as a row, loudly, then go on
        if (settings.source == "hub" or bench.plugin) and _unreachable(e):
            return {"status": "missing", "reason": f"hub data unreachable: {e}"}
        if bench.plugin and isinstance(e, FileNotFoundError):  # its task's own loader said so
            return {"status": "missing", "reason": f"{bench.name}: {e}"}
        return {"status": "error", "reason": f"{type(e).__name__}: {e}"}


def _num(x: Any) -> float | None:
    if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)):
        return float(x)
    return None


def _task_score(
    samples: list[dict[str, Any]], metric: str, bootstrap_iters: int
) -> tuple[float, float | None, int]:
    """(mean, its standard error, n) of one metric over a task's items, in doc order, with
    lm-eval's own functions (mean, mean_stderr: the sample standard deviation / sqrt(n)); no
    stderr for one item or with bootstrap_iters 0, as lm-eval."""
    from lm_eval.api.metrics import mean, mean_stderr

    values = [s[metric] for s in samples]
    stderr = mean_stderr(values) if len(values) > 1 and bootstrap_iters > 0 else None
    return float(mean(values)), _num(stderr), len(values)


def _entries_from_items(
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
    from lm_eval.api.metrics import aggregate_subtask_metrics, pooled_sample_stderr

    versions, nshot = info.get("versions", {}), info.get("n_shot", {})
    shots = nshot.get(
        task, next((v for k, v in nshot.items() if k != task), settings.num_fewshot.get(bench.name))
    )
    gen_toks = next(iter(info.get("gen_toks", {}).values()), None)
    common = {
        "source": settings.source,
        "lm_eval_version": lm_eval_version(),
        "limit": settings.limit,
        "num_fewshot": shots,
        "seconds": round(seconds, 3),
        **({"items": settings.items[bench.name]} if bench.name in settings.items else {}),
        **({"max_gen_toks": gen_toks} if gen_toks else {}),
        "status": "ok",
        "reason": None,
        "harness_task": bench.harness_task,
    }
    leaf = {
        t: {m: _task_score(samples[t], m, settings.bootstrap_iters) for m in bench.metrics} for t in order
    }
    out = []
    for metric in bench.metrics:
        if bench.group:
            scores = [leaf[t][metric] for t in order]
            sizes = [n for _, _, n in scores]
            value = float(aggregate_subtask_metrics([v for v, _, _ in scores], sizes, True))
            errs = [e for _, e, _ in scores]
            stderr = None if any(e is None for e in errs) else float(pooled_sample_stderr(errs, sizes))
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


def _merge(
    bench: Benchmark, task: str, parts: list[dict[str, Any]], settings: EvalSettings, seconds: float
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """(entries, per-item samples of each task sorted by doc_id) from every process's part."""
    failed = [(r, p) for r, p in enumerate(parts) if p["status"] != "ok"]
    if failed:
        status = "missing" if any(p["status"] == "missing" for _, p in failed) else "error"
        rank, part = next((r, p) for r, p in failed if p["status"] == status)
        where = f"process {rank} of {len(parts)}: " if len(parts) > 1 else ""
        return [_status_entry(bench, task, status, where + part["reason"], settings, seconds)], {}
    ran = [p for p in parts if p["samples"]]
    if not ran:
        return [_status_entry(bench, task, "error", "no items were selected", settings, seconds)], {}
    order = parts[0]["order"]
    samples = {
        t: sorted(
            (s for p in ran for s in p["samples"].get(t, []) if s.get("filter", "none") == "none"),
            key=lambda s: int(s["doc_id"]),
        )
        for t in order
    }
    return _entries_from_items(bench, task, samples, order, ran[0], settings, seconds), samples


def _unreachable(e: BaseException) -> bool:
    """The hub dataset cannot be fetched (offline, no network, unknown id)."""
    names = {
        "DatasetNotFoundError",
        "OfflineModeIsEnabled",
        "LocalEntryNotFoundError",
        "RepositoryNotFoundError",
    }
    return isinstance(e, ConnectionError) or type(e).__name__ in names


def _status_entry(
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
        "lm_eval_version": lm_eval_version(),
        "limit": settings.limit,
        "num_fewshot": None,
        "seconds": round(seconds, 3),
        "status": status,
        "reason": reason,
        "harness_task": bench.harness_task,
    }


def _write_samples(path: Path, samples: list[dict[str, Any]]) -> None:
    rows = []
    for s in samples:
        rows.append(
            {
                k: s.get(k)
                for k in ("doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter")
            }
            | {
                k: v
                for k, v in s.items()
                if k
                not in {
                    "doc_id",
                    "doc",
                    "target",
                    "arguments",
                    "resps",
                    "filtered_resps",
                    "filter",
                    "doc_hash",
                    "prompt_hash",
                    "target_hash",
                }
            }
        )
    atomic_write_jsonl(path, json.loads(json.dumps(rows, default=str)))


def _settings_json(settings: EvalSettings) -> dict[str, Any]:
    return json.loads(json.dumps(vars(settings) | {"num_fewshot": settings.num_fewshot}))


def _finished(
    out_dir: Path | None, settings: EvalSettings, resume_key: str | None
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
    if (
        old.get("resume_key") != resume_key
        or old.get("settings") != _settings_json(settings)
        or old.get("lm_eval_version") != lm_eval_version()
    ):
        return {}
    done: dict[str, list[dict[str, Any]]] = {}
    for e in old.get("entries", []):
        if e.get("status") == "ok":
            done.setdefault(str(e["benchmark"]).split("/")[0], []).append(e)
    return done


def run_benchmarks(
    lm: Any,
    benchmarks: list[str],
    settings: EvalSettings,
    out_dir: Path | None = None,
    resume_key: str | None = None,
    procs: Processes | None = None,
) -> list[dict[str, Any]]:
    """Evaluate `lm` (an lm-eval LM, e.g. from make_lm) on each benchmark; return entries
    (benchmark, metric, value, stderr, n, task, task_version, lm_eval_version, status, reason,
    seconds, ...). With out_dir: per-sample logs in out_dir/samples/<task>.jsonl and the entries
    so far in out_dir/benchmarks.json, rewritten (atomically) after every benchmark ("complete"
    says whether the call finished). With out_dir and a `resume_key` (what identifies the model:
    the CLI uses the model, adapter or run), a call that finds that file from an earlier call with
    the same key, settings and lm-eval version reuses its scored benchmarks instead of running
    them again: a killed evaluation keeps its finished benchmarks.

    With `procs` (several processes, each with its own `lm`, all calling this with the same
    arguments): each scores its share of the items; process 0 alone writes the files and returns
    the entries, the others return []."""
    procs = procs or Processes()
    lead = procs.rank == 0
    known = known_benchmarks(settings.task_paths)
    names = expand_benchmarks(benchmarks, settings.task_paths)
    tm = task_manager(settings, [known[n] for n in names])
    entries: list[dict[str, Any]] = []
    done = procs.broadcast(_finished(out_dir, settings, resume_key) if lead else None)

    def save(complete: bool) -> None:
        if out_dir is not None and lead:
            atomic_write_json(
                Path(out_dir) / "benchmarks.json",
                {
                    "entries": entries,
                    "settings": _settings_json(settings),
                    "lm_eval_version": lm_eval_version(),
                    "resume_key": resume_key,
                    "processes": procs.world,
                    "complete": complete,
                },
            )

    for name in names:
        bench = known[name]
        if name in done:
            entries += done[name]
            if lead:
                logger.info(f"{name}: reusing the scores of an earlier call in {out_dir}/benchmarks.json")
            continue
        task = bench.task_name(settings.source)
        t0 = time.perf_counter()
        if settings.source == "local" or bench.plugin:
            try:  # the same files for every process: they all skip, or none does
                if bench.plugin:
                    plugins.locate(bench)
                else:
                    local_data.locate(name, settings.data_dir, settings.humaneval_plus_file)
            except local_data.MissingDataError as e:
                if lead:
                    _loud(f"MISSING benchmark {name}: {e}")
                entries.append(_status_entry(bench, task, "missing", str(e), settings))
                continue
        if lead:
            ids = settings.items.get(name)
            limit = settings.gen_limit(name)
            logger.info(
                f"{name}: lm-eval task {task}, "
                + (f"items {ids}" if ids else f"limit {settings.limit}")
                + ", batch "
                f"{getattr(lm, 'batch_size', '?')}, {procs.world} process(es)"
                + (f", {settings.num_fewshot[name]} shots" if name in settings.num_fewshot else "")
                + (f", max_gen_toks {limit}" if limit else "")
            )
        parts = procs.gather(_score_my_share(lm, bench, task, tm, settings, procs))
        if not lead:
            continue
        got, samples = _merge(bench, task, parts, settings, time.perf_counter() - t0)
        entries += got
        main = got[0]
        if main["status"] != "ok":
            _loud(f"{main['status'].upper()} benchmark {name} ({task}): {main['reason']}")
        else:
            if out_dir is not None:
                for t, rows in samples.items():
                    _write_samples(Path(out_dir) / "samples" / f"{t}.jsonl", rows)
            sharing = parts[0]["sharing"]
            logger.info(
                f"{name}: {main['metric']} = {main['value']:.4f} (n={main['n']}) in "
                f"{main['seconds']:.1f}s" + (f" on {sharing} processes" if sharing > 1 else "")
            )
        save(complete=False)
    save(complete=True)
    return entries if lead else []


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
                "versions": json.dumps(v, sort_keys=True),
            }
        )
    return rows
