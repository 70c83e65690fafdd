"""Benchmarks from outside the suite: folders of lm-eval task YAMLs, and installed packages.

Either way gives a `Benchmark` that runs, scores, writes result rows (a `missing` row when its data
cannot be found) and shows in the reports as the eight built-in ones do (docs/add-a-benchmark.md):

- `eval.task_paths: [DIR, ...]`: every `*.yaml` under DIR that defines one lm-eval task
  (`task: NAME`) is the benchmark NAME. Its metrics are the YAML's `metric_list` (the first is the
  main one); its kind, what the reports group it under (code, medical or other), is
  `metadata.kind` (default other).
- the entry-point group `cluster_repro.benchmarks`: an installed package's pyproject.toml says

      [project.entry-points."cluster_repro.benchmarks"]
      medq5-example = "my_package:BENCHMARK"

  where BENCHMARK is a mapping {kind, task, metric (or metrics), task_dir (optional)}: the
  entry point's name is the benchmark's, `task` the lm-eval task it runs, from `task_dir` (a folder
  of task YAMLs) or, without one, from lm-eval's own tasks.

  Or, instead of `task`, `score`: a benchmark that scores the run's own held-out rows in the
  pipeline's eval stage (the rows a data source gives with what its scorer needs; the demo's
  held-out tasks are one: repro/demo/tasks.py, advertised by this package's pyproject.toml).
  {kind, metric, score, max_new_tokens}, where

      score(model, tokenizer, heldout, max_new_tokens, batch_size, device, limit)
          -> ({category: {"value", "stderr", "n"}, ..., "overall": {...}}, samples)

  takes the fine-tuned model and the held-out Pool, picks the rows it scores, and gives one score
  per category and over all of them (the rows `<name>/<category>`, `<name>/overall`) and one
  sample per row scored ({"id", "category", "score", ...}: eval_samples.jsonl).
  `max_new_tokens` is its own generation limit (eval.max_new_tokens.<name> overrides it). Its
  kind may also be `pool`: the reports then give its categories a table and an average of their
  own, under its name.

A plugin's lm-eval task runs as it is: `eval.source`/`--source` (local or hub) chooses between the
built-in benchmarks' task variants only. Data files its YAML names (`dataset_kwargs.data_files`,
relative paths read from the current directory, as lm-eval reads them) are looked for before it
runs, as the built-in benchmarks' are. Aliases (code, medical, all) keep naming the eight
built-in benchmarks, so an installed package never changes what a shipped config evaluates.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from evals.local_data import MissingDataError
from repro.core.errors import UserError

GROUP = "cluster_repro.benchmarks"
KINDS = ("code", "medical", "other")  # what the reports group a benchmark under
# ... and for a benchmark of held-out rows: its categories, as a group of their own
POOL_KIND = "pool"
_ENTRY_KEYS = ("name", "kind", "task", "metric", "metrics", "task_dir", "score", "max_new_tokens")


class BenchmarkPluginError(UserError, ValueError):
    """A plugin benchmark that cannot be used; the message names its file or entry point."""


@dataclass(frozen=True)
class Benchmark:
    name: str
    kind: str  # "code", "medical" or "other" (KINDS)
    metrics: tuple[str, ...]  # lm-eval metric names reported as rows, the main one first
    harness_task: str  # built-in: the lm-eval 0.4.13 task it mirrors; a plugin: the task it runs
    group: bool = False  # an lm-eval group of subtasks (mmlu_medical)
    plugin: bool = False  # from a task folder or a package: its lm-eval task runs as it is
    task_dir: str | None = None  # a plugin's folder of task YAMLs; None: lm-eval's own tasks
    yaml: str | None = None  # the YAML file that defines a plugin's task, where known
    origin: str = "built-in"  # where it came from, for `cluster-repro ls benchmarks`
    # A benchmark of the run's held-out rows: the function that scores them in the eval stage
    # (no lm-eval task), and its own generation limit.
    score: Callable[..., Any] | None = field(default=None, compare=False)
    max_new_tokens: int | None = None

    @property
    def heldout(self) -> bool:
        """Whether it scores the run's held-out rows (in the eval stage, not through lm-eval)."""
        return self.score is not None

    def task_name(self, source: str) -> str:
        """The lm-eval task to run: evals/tasks' `<name>_<source>` for a built-in benchmark, the
        plugin's own task otherwise."""
        return self.harness_task if self.plugin else f"{self.name}_{source}"


# ----------------------------------------------------------------------------- task folders


def _load_yaml(path: Path) -> dict[str, Any]:
    """A task YAML with its includes merged, `!function` tags left unresolved (lm-eval's loader)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        return load_yaml(path, resolve_func=False)
    except Exception as e:  # noqa: BLE001 - YAML syntax, a missing include: name the file
        raise BenchmarkPluginError(
            f"{path}: not a readable lm-eval task YAML: {type(e).__name__}: {e}"
        ) from None


def task_yamls(folder: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """task name -> (YAML file, its config) for every YAML under `folder` that defines one task
    (groups, which list tasks, are not benchmarks themselves)."""
    out: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in sorted(folder.rglob("*.yaml")):
        cfg = _load_yaml(path)
        task = cfg.get("task")
        if not isinstance(task, str) or "group" in cfg:
            continue
        if task in out:
            raise BenchmarkPluginError(f"task {task!r} is defined twice: {out[task][0]} and {path}")
        out[task] = (path, cfg)
    return out


def _metrics_of(path: Path, cfg: Mapping[str, Any]) -> tuple[str, ...]:
    entries = cfg.get("metric_list")
    names = (
        [m.get("metric") for m in entries]
        if isinstance(entries, list) and all(isinstance(m, dict) for m in entries)
        else []
    )
    if not names or not all(isinstance(n, str) and n for n in names):
        raise BenchmarkPluginError(
            f"{path}: metric_list: expected a list of {{metric: NAME, aggregation, "
            f"higher_is_better}}, got {entries!r}; the rows are named by these metrics"
        )
    return tuple(names)


def _kind_of(where: str, kind: Any, kinds: tuple[str, ...] = KINDS) -> str:
    if kind not in kinds:
        raise BenchmarkPluginError(
            f"{where}: kind {kind!r}: expected one of {', '.join(kinds)} "
            "(what the reports group the benchmark under)"
        )
    return kind


def folder_benchmarks(task_paths: Iterable[str]) -> list[Benchmark]:
    """The benchmarks of the eval.task_paths folders, one per task YAML."""
    out = []
    for i, raw in enumerate(task_paths):
        folder = Path(raw).expanduser()
        if not folder.is_dir():
            raise BenchmarkPluginError(
                f"eval.task_paths[{i}] = {raw!r}: no such folder (relative "
                "paths are read from the current directory)"
            )
        for task, (path, cfg) in task_yamls(folder).items():
            meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
            out.append(
                Benchmark(
                    name=task,
                    kind=_kind_of(f"{path}: metadata.kind", meta.get("kind", "other")),
                    metrics=_metrics_of(path, cfg),
                    harness_task=task,
                    plugin=True,
                    task_dir=str(folder),
                    yaml=str(path),
                    origin=f"eval.task_paths: {path}",
                )
            )
    return out


# ----------------------------------------------------------------------------- packages


def _entry_benchmark(ep: Any) -> Benchmark:
    dist = getattr(ep, "dist", None)
    where = f"entry point {ep.name!r} = {ep.value!r} of {dist.name if dist else 'a package'}"
    try:
        spec = ep.load()
    except Exception as e:  # a broken third-party package: say which one
        raise BenchmarkPluginError(f"{where}: failed to load: {type(e).__name__}: {e}") from e
    if not isinstance(spec, Mapping):
        raise BenchmarkPluginError(
            f"{where}: expected a mapping {{kind, task, metric, task_dir}}, got {type(spec).__name__}"
        )
    unknown = sorted(set(spec) - set(_ENTRY_KEYS))
    if unknown:
        raise BenchmarkPluginError(f"{where}: unknown keys {unknown}; expected {', '.join(_ENTRY_KEYS)}")
    if spec.get("name", ep.name) != ep.name:
        raise BenchmarkPluginError(
            f"{where}: name {spec['name']!r} differs from the entry point's name, which is the benchmark's"
        )
    origin = f"entry point of {dist.name if dist else 'an installed package'}"
    if "score" in spec:
        return _heldout_benchmark(ep.name, spec, where, origin)
    if "max_new_tokens" in spec:
        raise BenchmarkPluginError(
            f"{where}: max_new_tokens: only a benchmark with `score` takes one (an lm-eval task's "
            "YAML sets its own generation limit)"
        )
    task = spec.get("task")
    if not isinstance(task, str) or not task:
        raise BenchmarkPluginError(f"{where}: task: expected the lm-eval task name, got {task!r}")
    metrics = _metrics(where, spec)
    yaml = task_dir = None
    if spec.get("task_dir") is not None:
        folder = Path(spec["task_dir"])
        if not folder.is_dir():
            raise BenchmarkPluginError(f"{where}: task_dir {str(folder)!r} is not a folder")
        found = task_yamls(folder).get(task)
        if found is None:
            raise BenchmarkPluginError(f"{where}: no YAML in task_dir {str(folder)!r} defines task {task!r}")
        task_dir, yaml = str(folder), str(found[0])
    return Benchmark(
        name=ep.name,
        kind=_kind_of(where, spec.get("kind")),
        metrics=tuple(metrics),
        harness_task=task,
        plugin=True,
        task_dir=task_dir,
        yaml=yaml,
        origin=origin,
    )


def _metrics(where: str, spec: Mapping[str, Any]) -> tuple[str, ...]:
    metrics = spec.get("metrics", [spec["metric"]] if "metric" in spec else None)
    if (
        not isinstance(metrics, (list, tuple))
        or not metrics
        or not all(isinstance(m, str) and m for m in metrics)
    ):
        raise BenchmarkPluginError(
            f"{where}: metric: expected a metric name (or metrics: a list of them), got {metrics!r}"
        )
    return tuple(metrics)


def _heldout_benchmark(name: str, spec: Mapping[str, Any], where: str, origin: str) -> Benchmark:
    """A benchmark of the run's held-out rows: {kind, metric, score, max_new_tokens}."""
    if "task" in spec or "task_dir" in spec:
        raise BenchmarkPluginError(
            f"{where}: give `task` (an lm-eval task) or `score` (a function that scores the run's "
            "held-out rows), not both"
        )
    if not callable(spec["score"]):
        raise BenchmarkPluginError(
            f"{where}: score: expected a function (model, tokenizer, heldout, max_new_tokens, "
            f"batch_size, device, limit) -> (scores, samples), got {spec['score']!r}"
        )
    limit = spec.get("max_new_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise BenchmarkPluginError(
            f"{where}: max_new_tokens: expected its own generation limit, a positive number of "
            f"tokens, got {limit!r}"
        )
    metrics = _metrics(where, spec)
    if len(metrics) != 1:
        raise BenchmarkPluginError(
            f"{where}: metric: a benchmark of held-out rows reports one, got {list(metrics)}"
        )
    return Benchmark(
        name=name,
        kind=_kind_of(where, spec.get("kind"), (*KINDS, POOL_KIND)),
        metrics=metrics,
        harness_task="",
        plugin=True,
        origin=origin,
        score=spec["score"],
        max_new_tokens=limit,
    )


_SEEN: dict[str, Any] = {}  # the entry points of GROUP and the sys.path state they were read under


def _path_state() -> tuple[tuple[str, int | None], ...]:
    """Each sys.path entry with its folder's modification time (None: not a folder here)."""
    state = []
    for p in sys.path:
        try:
            state.append((p, os.stat(p or ".").st_mtime_ns))
        except OSError:
            state.append((p, None))
    return tuple(state)


def _group_entry_points() -> tuple[Any, ...]:
    """The entry points of GROUP, read again only when sys.path or one of its folders changed:
    installing or removing a package changes its folder's modification time (importlib.metadata
    keeps its own folder listings the same way). A preflight asks for the known benchmarks for
    every check of every cell, and each read opens every installed distribution's metadata."""
    state = _path_state()
    if _SEEN.get("state") != state:
        _SEEN["points"] = tuple(entry_points(group=GROUP))
        _SEEN["state"] = state
    return _SEEN["points"]


def package_benchmarks() -> list[Benchmark]:
    """The benchmarks installed packages advertise in the entry-point group."""
    return [_entry_benchmark(ep) for ep in sorted(_group_entry_points(), key=lambda e: e.name)]


def plugin_benchmarks(task_paths: Iterable[str], reserved: Collection[str]) -> dict[str, Benchmark]:
    """name -> Benchmark for every package's and task folder's benchmark. A name that is
    `reserved` (a built-in benchmark, alias or task) or given twice is an error naming both."""
    out: dict[str, Benchmark] = {}
    for b in [*package_benchmarks(), *folder_benchmarks(task_paths)]:
        if b.name in reserved:
            raise BenchmarkPluginError(
                f"benchmark {b.name!r} ({b.origin}) has the name of a "
                "built-in benchmark, alias or task; rename its task"
            )
        if b.name in out:
            raise BenchmarkPluginError(
                f"benchmark {b.name!r} is defined twice: {out[b.name].origin} and {b.origin}"
            )
        out[b.name] = b
    return out


# ----------------------------------------------------------------------------- data files


def _data_files(cfg: Mapping[str, Any]) -> list[str]:
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if files is None:
        return []
    if isinstance(files, str):
        return [files]
    if isinstance(files, dict):
        files = [f for v in files.values() for f in ([v] if isinstance(v, str) else v)]
    return [str(f) for f in files]


def locate(bench: Benchmark) -> list[Path]:
    """The local data files a plugin's task YAML names; MissingDataError naming the first one
    not found (URLs are left to the harness)."""
    if bench.yaml is None:
        return []
    found = []
    for name in _data_files(_load_yaml(Path(bench.yaml))):
        if "://" in name:
            continue
        hits = glob.glob(name) if glob.has_magic(name) else [name] if Path(name).is_file() else []
        if not hits:
            raise MissingDataError(
                f"{bench.name}: data file {name!r} not found (named by dataset_kwargs.data_files "
                f"in {bench.yaml}; relative paths are read from the current directory, "
                f"{Path.cwd()})"
            )
        found += [Path(h) for h in hits]
    return found
