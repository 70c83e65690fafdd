"""Run benchmarks on a model and turn the results into result entries, writing per-sample logs.

    entries = run_benchmarks(make_lm(model, tok), ["medqa", "humaneval"], EvalSettings(...), out_dir)

The registry and settings live in evals/benchmarks.py, everything lm-eval in evals/harness.py
(make_lm among it), entries and rows in evals/entries.py.

Each benchmark is evaluated on its own, so one failing benchmark never hides the others: data
that cannot be found gives a `missing` entry and a loud banner on stderr, a crash an `error`
entry; nothing is skipped silently. Every entry carries lm-eval's version and the task's version.

Several processes can evaluate together (evals/parallel.py starts them, one per GPU): every
process scores its share of each benchmark's items (`_my_items`: items i, i + P, i + 2P, ... for
process i of P) through lm-eval's `samples` argument, and process 0 gathers the per-item results
and computes the entries from them (`entries_from_items`, with lm-eval's own metric functions).
A lone process takes the same path with all the items, so the entries do not depend on how many
processes scored the items, only on the items' scores.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from evals import harness, local_data, plugins
from evals.benchmarks import EvalSettings, expand_benchmarks, known_benchmarks
from evals.entries import entries_from_items, status_entry
from evals.harness import task_manager
from evals.plugins import Benchmark
from repro.core.errors import UserValueError
from repro.core.io import atomic_write_json, atomic_write_jsonl
from repro.core.log import get_logger

logger = get_logger("eval")


def _loud(msg: str) -> None:
    """A warning no one scrolling a log can miss: the message between two rows of '!'."""
    bar = "!" * 78
    logger.warning(f"{bar}\n{msg}\n{bar}")


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


def _my_items(
    bench: Benchmark, tasks: dict[str, Any], settings: EvalSettings, procs: Processes
) -> tuple[dict[str, list[int]], int]:
    """(this process's items of each task, how many processes share them). Items are dealt round
    robin (item i to process i mod P), which balances both counts and lengths (items of one task
    come in no length order). A benchmark whose shots depend on the order goes whole to process
    0, so its items get the shots a lone process would give them."""
    chosen = {name: settings.item_indices(bench.name, harness.n_docs(t)) for name, t in tasks.items()}
    if harness.shots_depend_on_order(tasks, settings.num_fewshot.get(bench.name)):
        return (chosen if procs.rank == 0 else {name: [] for name in chosen}), 1
    return {name: ids[procs.rank :: procs.world] for name, ids in chosen.items()}, procs.world


def _score_my_share(
    lm: Any, bench: Benchmark, task: str, tm: Any, settings: EvalSettings, procs: Processes
) -> dict[str, Any]:
    """This process's part of one benchmark: the per-item results of its share of the items.
    Never raises: a failure is a part with status "missing" or "error", so that every process
    still reaches the gather and process 0 reports it."""
    try:
        tasks, groups = harness.load_tasks(tm, task)  # leaf tasks in the group's order
        mine, sharing = _my_items(bench, tasks, settings, procs)
        run = {name: ids for name, ids in mine.items() if ids}
        part: dict[str, Any] = {"status": "ok", "order": list(tasks), "sharing": sharing, "samples": {}}
        if not run:  # fewer items than processes: nothing for this one
            return part
        # Every task with items: the group itself (rank 0 always, having item 0 of each); a
        # task without items must be left out, as lm-eval reads an empty list as "all items".
        objs = (
            list(groups.values()) if bench.group and len(run) == len(tasks) else [tasks[name] for name in run]
        )
        limit = settings.gen_limit(bench.name)
        if procs.rank == 0:
            total = sum(len(settings.item_indices(bench.name, harness.n_docs(t))) for t in tasks.values())
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
        res = harness.evaluate_items(lm, objs, tm, run, settings, bench.name, limit, procs.rank == 0)
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


def _merge(
    bench: Benchmark, task: str, parts: list[dict[str, Any]], settings: EvalSettings, seconds: float
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """(entries, per-item samples of each task sorted by doc_id) from every process's part."""
    failed = [(r, p) for r, p in enumerate(parts) if p["status"] != "ok"]
    if failed:
        status = "missing" if any(p["status"] == "missing" for _, p in failed) else "error"
        rank, part = next((r, p) for r, p in failed if p["status"] == status)
        where = f"process {rank} of {len(parts)}: " if len(parts) > 1 else ""
        return [status_entry(bench, task, status, where + part["reason"], settings, seconds)], {}
    ran = [p for p in parts if p["samples"]]
    if not ran:
        return [status_entry(bench, task, "error", "no items were selected", settings, seconds)], {}
    order = parts[0]["order"]
    samples = {
        t: sorted(
            (s for p in ran for s in p["samples"].get(t, []) if s.get("filter", "none") == "none"),
            key=lambda s: int(s["doc_id"]),
        )
        for t in order
    }
    return entries_from_items(bench, task, samples, order, ran[0], settings, seconds), samples


def _unreachable(e: BaseException) -> bool:
    """The hub dataset cannot be fetched (offline, no network, unknown id)."""
    names = {
        "DatasetNotFoundError",
        "OfflineModeIsEnabled",
        "LocalEntryNotFoundError",
        "RepositoryNotFoundError",
    }
    return isinstance(e, ConnectionError) or type(e).__name__ in names


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
        or old.get("lm_eval_version") != harness.lm_eval_version()
    ):
        return {}
    done: dict[str, list[dict[str, Any]]] = {}
    for e in old.get("entries", []):
        if e.get("status") == "ok":
            done.setdefault(str(e["benchmark"]).split("/")[0], []).append(e)
    return done


def _evalplus_entries(
    lm: Any, bench: Benchmark, settings: EvalSettings, out_dir: Path | None, cache: dict[Any, Any]
) -> list[dict[str, Any]]:
    """One benchmark under the evalplus protocol, never raising (a missing file: `missing`)."""
    from evals.evalplus import protocol as evalplus_protocol

    t0 = time.perf_counter()
    task = f"evalplus_{bench.name}"
    try:
        got = evalplus_protocol.score_benchmark(lm, bench, settings, out_dir, cache)
    except local_data.MissingDataError as e:
        _loud(f"MISSING benchmark {bench.name} (evalplus protocol): {e}")
        return [status_entry(bench, task, "missing", str(e), settings, time.perf_counter() - t0)]
    except Exception as e:  # noqa: BLE001 - reported as a row, loudly, then go on
        reason = f"{type(e).__name__}: {e}"
        _loud(f"ERROR benchmark {bench.name} (evalplus protocol): {reason}")
        return [status_entry(bench, task, "error", reason, settings, time.perf_counter() - t0)]
    main = got[0]
    if main["status"] == "ok":
        logger.info(
            f"{bench.name} (evalplus): {main['metric']} = {main['value']:.4f} (n={main['n']}) in "
            f"{main['seconds']:.1f}s"
        )
    return got


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
    # EvalPlus's time limits come from the reference's times measured in this evaluation.
    from evals.evalplus.check import clear_reference_timings

    clear_reference_timings()
    known = known_benchmarks(settings.task_paths)
    names = expand_benchmarks(benchmarks, settings.task_paths)
    for n in names:
        if known[n].heldout:
            raise UserValueError(
                f"benchmark {n!r} scores the held-out rows of a run's pool, in the run's own eval "
                "stage (cluster-repro run; eval.benchmarks), not through lm-eval: leave it out here"
            )
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
                    "lm_eval_version": harness.lm_eval_version(),
                    "resume_key": resume_key,
                    "processes": procs.world,
                    "complete": complete,
                },
            )

    evalplus_cache: dict[Any, Any] = {}  # generations mbpp and mbpp_plus share
    for name in names:
        bench = known[name]
        if name in done:
            entries += done[name]
            if lead:
                logger.info(f"{name}: reusing the scores of an earlier call in {out_dir}/benchmarks.json")
            continue
        task = bench.task_name(settings.source)
        t0 = time.perf_counter()
        if settings.protocol_of(name) == "evalplus":
            # Scored by process 0 alone (generation and sandbox), the others wait at the next
            # benchmark's gather; not split over processes.
            if lead:
                entries += _evalplus_entries(lm, bench, settings, out_dir, evalplus_cache)
                save(complete=False)
            continue
        if settings.source == "local" or bench.plugin:
            try:  # the same files for every process: they all skip, or none does
                if bench.plugin:
                    plugins.locate(bench)
                else:
                    local_data.locate(
                        name, settings.data_dir, settings.humaneval_plus_file, settings.evalplus_version
                    )
            except local_data.MissingDataError as e:
                if lead:
                    _loud(f"MISSING benchmark {name}: {e}")
                entries.append(status_entry(bench, task, "missing", str(e), settings))
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
        if getattr(lm, "oracle", None) == "canonical" and got[0]["status"] == "ok":
            # Tasks the canonical solution fails: a defect of the data or of the scorer.
            got[0]["oracle_failed_tasks"] = [
                str((s.get("doc") or {}).get("task_id", s["doc_id"]))
                for rows in samples.values()
                for s in rows
                if s.get(bench.metrics[0], 1) == 0
            ]
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
