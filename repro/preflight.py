"""Preflight: check a config for mistakes that would otherwise surface only after training.

Loading a config (repro/core/config/load.py) already checks keys, types and ranges. What it cannot check
needs the rest of the suite or the file system: benchmark names (evals/), selector and allocator
names and parameters (the registries), the optional extras they and the model need
(repro/core/extras.py), data files, the output folder and a local model folder (those two in
repro/preflight_paths.py; every path resolved as the stages resolve it), feature shards against
the pool, and settings that are valid values but almost surely a slip
(`selection.params.ratio: 0.5`, a percentage). Those checks live here, as small
functions run before the first stage by `validate`, `run`, `select`, `grid` and `launch`
(its `--dry-run` too: one set of checks, one verdict):

    problems = preflight(cfg)                      # every check, in order
    errors = [p for p in problems if p.blocking]   # these stop a run or a launch
    print(format_problems(problems, "configs/demo.yaml"))
    require_clean([(where, cfg), ...])             # raises PreflightError listing every error

A check is a function `(cfg, ctx) -> list[Problem]`, registered with `@check`; add one to check
more (`ctx.profile` is the cluster profile when launching, for checks such as a GPU-memory plan).
A Problem names the config key and says what is wrong and what is allowed; a note (not blocking)
says what could not be checked here, e.g. a hub dataset while offline. The machinery (Problem,
the registry, the report) is in repro/problems.py; this module holds the checks and runs them, so
importing `preflight` or `require_clean` from here registers every check first.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

# The checks of output_dir and a local model folder (paths resolved as the stages resolve them):
# importing the module registers them, before the checks below.
from repro import preflight_paths  # noqa: F401
from repro.core.config.builder import ConfigError
from repro.core.config.schema import ExperimentConfig
from repro.problems import (
    CHECKS,
    MISSING_BENCHMARK,
    CheckContext,
    PreflightError,
    Problem,
    _did_you_mean,
    check,
    report,
)

# ----------------------------------------------------------------------------- running the checks


def preflight(cfg: ExperimentConfig, ctx: CheckContext | None = None) -> list[Problem]:
    """Every problem (and note) that the registered checks find in `cfg`."""
    ctx = ctx or CheckContext()
    out: list[Problem] = []
    for fn in CHECKS:
        out += fn(cfg, ctx)
    return out


def preflight_all(
    configs: list[tuple[str, ExperimentConfig]], ctx: CheckContext | None = None
) -> dict[str, list[Problem]]:
    """`where` -> its problems and notes, for each (where, config); `where` names the config file,
    run or grid cell in messages."""
    return {where: preflight(cfg, ctx) for where, cfg in configs}


def require_clean(
    configs: list[tuple[str, ExperimentConfig]], ctx: CheckContext | None = None
) -> dict[str, list[Problem]]:
    """Check every config before any runs; raise PreflightError listing every blocking problem
    of every config, else return the findings (notes only)."""
    found = preflight_all(configs, ctx)
    n_err = sum(p.blocking for problems in found.values() for p in problems)
    if n_err:
        bad = sum(any(p.blocking for p in problems) for problems in found.values())
        raise PreflightError(
            f"{n_err} problem(s) in {bad} of {len(found)} config(s), found before "
            f"anything ran:\n{report(found)}"
        )
    return found


# ----------------------------------------------------------------------------- checks


@check
def check_benchmarks(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """eval.benchmarks: names (or aliases) the suite's evals know, plugins included (installed
    packages, eval.task_paths folders: an unusable one is a problem of eval.task_paths); lm-eval's
    own task name for a benchmark (medqa_4options) points at the suite's name (medqa). A benchmark
    whose local data is not found is a note: its evaluation writes a `missing` row, the others
    still run."""
    if not cfg.eval.benchmarks and not cfg.eval.task_paths:
        return []
    from evals.benchmarks import expand_benchmarks, known_benchmarks
    from evals.plugins import BenchmarkPluginError

    try:
        table = known_benchmarks(cfg.eval.task_paths)
    except BenchmarkPluginError as e:
        return [Problem("eval.task_paths", str(e))]
    out: list[Problem] = []
    names: list[str] = []
    for i, raw in enumerate(cfg.eval.benchmarks):  # one at a time, so every bad one is named
        try:
            names += expand_benchmarks([raw], cfg.eval.task_paths)
        except ValueError as e:
            out.append(Problem(f"eval.benchmarks[{i}]", str(e)))
    names = list(dict.fromkeys(names))
    out += _plugin_data_notes([table[n] for n in names if table[n].plugin])
    out += _heldout_sources(cfg, [n for n in names if table[n].heldout])
    if getattr(cfg.eval, "source", "local") == "local":
        out += _benchmark_data_notes(cfg, ctx, [n for n in names if not table[n].plugin])
    return out


def _heldout_sources(cfg: ExperimentConfig, names: list[str]) -> list[Problem]:
    """A benchmark of held-out rows scores the rows a data source gives it: a note where no source
    of data.sources declares it (it then scores nothing; a grid's base may name it for the
    cells of its own source)."""
    from repro.core.sources import declared

    given = {getattr(declared(src.path), "benchmark", None) for src in cfg.data.sources}
    return [
        Problem(
            "eval.benchmarks",
            f"{n!r} scores the held-out rows a data source gives it, and no source of data.sources "
            f"does (a registered source declares the benchmark of its held-out rows: `cluster-repro "
            f"ls sources`): it scores nothing here",
            blocking=False,
        )
        for n in names
        if n not in given
    ]


@check
def check_generation_limits(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """eval.max_new_tokens as a mapping: every key is a generation task (a code benchmark, or a
    benchmark that scores held-out rows: the demo's); the values were checked at config load."""
    limits = cfg.eval.max_new_tokens
    if not isinstance(limits, dict):
        return []
    from evals.benchmarks import CODE_BENCHMARKS, heldout_benchmarks
    from evals.plugins import BenchmarkPluginError

    try:
        pool_tasks = list(heldout_benchmarks(cfg.eval.task_paths))
    except BenchmarkPluginError:  # check_benchmarks names it
        pool_tasks = []
    tasks = (*pool_tasks, *CODE_BENCHMARKS)  # every generation task of the eval stage
    return [
        Problem(
            f"eval.max_new_tokens.{task}",
            f"{task!r} is not a generation task{_did_you_mean(str(task), list(tasks))} "
            f"(generation tasks: {', '.join(tasks)})",
        )
        for task in limits
        if task not in tasks
    ]


@check
def check_protocols(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """eval.protocol: every key a benchmark the config evaluates, every value a protocol that
    exists and scores that benchmark; for the evalplus protocol, the template (the run's training
    format unless eval.template says otherwise and eval.allow_other_template allows it), the
    evalplus extra, and a local HumanEval+ file in EvalPlus's release format."""
    ev = cfg.eval
    if ev.protocol is None and ev.template is None:
        return []
    from evals.benchmarks import (
        expand_benchmarks,
        known_benchmarks,
        protocol_map,
        protocol_problem,
        resolve_template,
    )

    try:
        names = expand_benchmarks(ev.benchmarks, ev.task_paths)
        known = list(known_benchmarks(ev.task_paths))
    except Exception:  # noqa: BLE001 - check_benchmarks names the bad benchmark
        return []
    if ev.protocol is not None and not isinstance(ev.protocol, (str, dict)):
        return [Problem("eval.protocol", f"expected a protocol name or a mapping, got {ev.protocol!r}")]
    out: list[Problem] = []
    protocols = protocol_map(ev.protocol, names)
    for bench, proto in protocols.items():
        if bench not in known:  # a known benchmark not evaluated here is fine (a grid's base)
            out.append(
                Problem(
                    f"eval.protocol.{bench}",
                    f"{bench!r} is no benchmark{_did_you_mean(str(bench), known)} (known: "
                    f"{', '.join(known)}); name a benchmark or remove this key",
                )
            )
            continue
        problem = protocol_problem(bench, proto)
        if problem:
            out.append(Problem(f"eval.protocol.{bench}", problem))
    evalplus = [b for b, p in protocols.items() if p == "evalplus" and b in names]
    if not evalplus:
        return out
    template, problem = resolve_template(
        [src.format for src in cfg.data.sources], ev.template, ev.allow_other_template, cfg.data.chat_template
    )
    if problem:
        out.append(Problem("eval.template", problem))
    from repro.core.extras import extra_problem

    missing = extra_problem("evalplus", "eval.protocol: evalplus", "use the lm-eval protocol")
    if missing:
        out.append(Problem("eval.protocol", missing))
    if "humaneval_plus" in evalplus:
        out += _humaneval_plus_format(cfg, ctx)
    return out


@check
def check_evalplus_version(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """eval.evalplus_version: a version the suite knows, and the MBPP+ file found for it holds
    that version (a missing file is a note of check_benchmarks: a 'missing' row)."""
    version = cfg.eval.evalplus_version
    if version is None:
        return []
    from evals import local_data
    from evals.evalplus import data as evalplus_data

    data_dir, _ = ctx.data_dir(cfg)
    try:
        path = local_data.mbpp_plus_file(str(data_dir) if data_dir else None, version)
        evalplus_data.check_version(path, local_data._read_jsonl(path), version)
    except local_data.MissingDataError:
        return []
    except ValueError as e:  # FormatError: an unknown version, or another version's file
        return [Problem("eval.evalplus_version", str(e))]
    return []


def _humaneval_plus_format(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """The local HumanEval+ file, where there is one, is in EvalPlus's release format."""
    from evals import local_data
    from evals.evalplus import data as evalplus_data

    data_dir, _ = ctx.data_dir(cfg)
    try:
        path = local_data.humaneval_plus_file(str(data_dir) if data_dir else None)
        evalplus_data.check_release_rows(path, local_data._read_jsonl(path))
    except local_data.MissingDataError:
        return []  # check_benchmarks notes the missing file
    except ValueError as e:  # FormatError, or a line that is not JSON
        return [
            Problem(
                "eval.protocol.humaneval_plus",
                f"{e}. Fix: put evalplus's HumanEvalPlus.jsonl release file (base_input, "
                "plus_input per task) there, or score humaneval_plus with protocol lm-eval",
            )
        ]
    return []


def _benchmark_data_notes(cfg: ExperimentConfig, ctx: CheckContext, names: list[str]) -> list[Problem]:
    from evals import local_data

    data_dir, _ = ctx.data_dir(cfg)
    out = []
    for name in names:
        try:
            version = cfg.eval.evalplus_version
            local_data.locate(name, str(data_dir) if data_dir else None, evalplus_version=version)
        except local_data.MissingDataError as e:
            out.append(
                Problem(
                    "eval.benchmarks",
                    f"local data not found here: {e} (its evaluation will write a 'missing' row)",
                    blocking=False,
                    kind=MISSING_BENCHMARK,
                )
            )
    return out


def _plugin_data_notes(benches: list[Any]) -> list[Problem]:
    from evals import local_data, plugins

    out = []
    for b in benches:
        try:
            plugins.locate(b)
        except local_data.MissingDataError as e:
            out.append(
                Problem(
                    "eval.benchmarks",
                    f"data not found here: {e} (its evaluation will write a 'missing' row)",
                    blocking=False,
                    kind=MISSING_BENCHMARK,
                )
            )
    return out


def _method_problems(
    kind: str, key: str, name: str, params: dict[str, Any], method_name: str
) -> list[Problem]:
    """A selector's or allocator's name resolves (built-in, entry point or module:Class), a
    plugin is a class with the protocol's method, and the class accepts its params."""
    from repro.core.registry import ALLOCATORS, SELECTORS

    reg = SELECTORS if kind == "selector" else ALLOCATORS
    section = key.rsplit(".", 1)[0]  # "selection" or "allocation"
    try:
        obj = reg.get(name)
    except ConfigError as e:
        return [Problem(key, str(e))]
    plugin = ":" in name or "entry point" in reg.origin(name)
    if plugin and (not inspect.isclass(obj) or not callable(getattr(obj, method_name, None))):
        return [
            Problem(
                key,
                f"{name!r} resolves to {obj!r}, not a {kind} class: expected a "
                f"class with a {method_name}() method (repro/core/interfaces.py)",
            )
        ]
    try:
        reg.create(name, params, f"{section}.params")  # constructors only store their params
    except ConfigError as e:
        return [_keyed(str(e), f"{section}.params")]
    except Exception as e:  # noqa: BLE001 - a plugin's constructor failing otherwise: say so
        return [
            Problem(
                f"{section}.params",
                f"{kind} {name!r} could not be created with {params!r}: {type(e).__name__}: {e}",
            )
        ]
    return []


def _keyed(message: str, default_key: str) -> Problem:
    """A Problem from an error message that may start with its own key ("a.b.c: what")."""
    head, sep, rest = message.partition(": ")
    if sep and head.startswith(default_key) and " " not in head:
        return Problem(head, rest)
    return Problem(default_key, message)


@check
def check_selector(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """selection.method: registered (did you mean), importable, a class with select(); its
    selection.params accepted by its constructor."""
    s = cfg.selection
    return _method_problems("selector", "selection.method", s.method, s.params, "select")


@check
def check_allocator(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """allocation.method: as the selector, with allocate()."""
    a = cfg.allocation
    return _method_problems("allocator", "allocation.method", a.method, a.params, "allocate")


@check
def check_model_extra(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """model.name_or_path: a builtin model built from an optional extra's package has it installed
    (the selector's extras are checked by its constructor, in check_selector)."""
    from repro.core.extras import extra_problem
    from repro.core.models import BUILTIN_EXTRAS

    name = cfg.model.name_or_path
    problem = name in BUILTIN_EXTRAS and extra_problem(
        BUILTIN_EXTRAS[name], f"{name!r}", "set a local model directory"
    )
    return [Problem("model.name_or_path", problem)] if problem else []


@check
def check_data_files(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """At least one source. Local data files exist (relative paths against data_dir, else
    $CLUSTER_REPRO_DATA); a registered data source resolves and takes its params (its class
    checks them: the demo's sizes and shares); `hf:` sources cannot be checked offline (a note)."""
    from repro.core.sources import HUB_PREFIX, WHAT_A_PATH_IS, is_plugin, plugin_of

    if not cfg.data.sources:
        return [Problem("data.sources", f"no data source given; expected at least one: {WHAT_A_PATH_IS}")]
    out: list[Problem] = []
    for i, src in enumerate(cfg.data.sources):
        key = f"data.sources[{i}]"
        if is_plugin(src.path):
            try:
                plugin_of(src, i)
            except ConfigError as e:
                out.append(_keyed(str(e), key))
        elif src.path.startswith(HUB_PREFIX):
            out.append(
                Problem(
                    f"{key}.path",
                    f"{src.path}: a hub dataset, not checked here (it is fetched when the pool stage runs)",
                    blocking=False,
                )
            )
        else:
            out += _file_problems(cfg, ctx, f"{key}.path", src.path)
        if src.exclude_ids_file:
            out += _file_problems(cfg, ctx, f"{key}.exclude_ids_file", src.exclude_ids_file)
    return out


def _file_problems(cfg: ExperimentConfig, ctx: CheckContext, key: str, rel: str) -> list[Problem]:
    from repro.core.data import not_a_file

    p = Path(rel).expanduser()
    if p.is_absolute():
        what = not_a_file(p)
        return (
            [Problem(key, f"file {str(p)!r} not found" if what == "not found" else f"{str(p)!r} is {what}")]
            if what
            else []
        )
    d, origin = ctx.data_dir(cfg)
    if d is None:
        return [
            Problem(
                key,
                f"{rel!r} is relative, but no data directory is set: set the config "
                "key data_dir or the environment variable CLUSTER_REPRO_DATA",
            )
        ]
    if not d.is_dir():
        return [Problem(key, f"{rel!r}: the data directory {str(d)!r} (from {origin}) does not exist")]
    what = not_a_file(d / p)
    if what == "not found":
        return [
            Problem(
                key, f"file {str(d / p)!r} not found ({rel!r} relative to the data directory from {origin})"
            )
        ]
    if what:
        return [Problem(key, f"{str(d / p)!r} is {what}")]
    return []


@check
def check_batches(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """Budget settings that only fail later: selection.n against a pool whose size the config
    bounds (a registered source that gives its count, or every source with a `limit`). (Global
    batch vs per-device batch x world size, and eval.limit, are checked at load; the selector's
    own parameters, the feature batch among them, by its Params.)"""
    out: list[Problem] = []
    bound = _pool_upper_bound(cfg)
    if cfg.selection.n is not None and bound is not None and cfg.selection.n > bound:
        out.append(
            Problem(
                "selection.n",
                f"{cfg.selection.n} is larger than the pool can be (at "
                f"most {bound} examples from data.sources); use at most "
                f"{bound} or selection.fraction",
            )
        )
    from repro.contracts import takes_budget

    if (s_ := cfg.selection).method and (s_.n is not None or s_.fraction not in (None, 1.0)):
        try:
            own_count = not takes_budget(s_.method)
        except ConfigError:  # an unknown selector: check_selector names it
            own_count = False
        if own_count:
            out.append(
                Problem(
                    "selection.n" if s_.n is not None else "selection.fraction",
                    f"selector {s_.method!r} sets its own kept count and takes no budget; "
                    "remove selection.n / selection.fraction",
                )
            )
    # A selection too small to give every worker one micro-batch: known before select when
    # selection.n is set, or selection.fraction of a pool the config bounds.
    need = cfg.world_size * cfg.train.per_device_batch_size
    s = cfg.selection
    planned, key = (s.n, "selection.n") if s.n is not None else (None, "selection.fraction")
    if planned is None and s.fraction is not None and bound is not None:
        planned = max(1, round(s.fraction * bound))
    if planned is not None and planned < need:
        out.append(
            Problem(
                key,
                f"{s.n if s.n is not None else s.fraction} gives {planned} examples, fewer than one "
                f"micro-batch per worker needs: world_size {cfg.world_size} x "
                f"train.per_device_batch_size {cfg.train.per_device_batch_size} = {need}; raise it "
                "(or use fewer workers or a smaller batch)",
            )
        )
    return out


@check
def check_feature_shards(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """selection.params.feature_shards (a selector that shards its feature pass, CluSTER's): at
    most one shard per batch of the pass, which has ceil(N / feature_batch_size) batches of the
    pool's N rows. Known here when the config bounds the pool (demo, or every source with a
    `limit`); otherwise the pass says so when it starts, after the pool stage."""
    from repro.core.registry import SELECTORS

    s = cfg.selection
    if "feature_shards" not in s.params or (bound := _pool_upper_bound(cfg)) is None:
        return []
    try:
        sel = SELECTORS.create(s.method, s.params, "selection.params")
        shards, batch = int(sel.feature_shards), int(sel.feature_batch_size)
    except Exception:  # noqa: BLE001 - check_selector names a selector or parameter that is wrong
        return []
    most = -(-bound // batch)
    if shards <= most:
        return []
    return [
        Problem(
            "selection.params.feature_shards",
            f"{shards} shards, but the feature pass has at most {most} batches (at most {bound} "
            f"pool rows from data.sources, selection.params.feature_batch_size {batch}); use at "
            f"most {most}",
        )
    ]


def _pool_upper_bound(cfg: ExperimentConfig) -> int | None:
    """The most training examples the sources can give, when the config says (else None): a
    registered source's own count, a file's `limit`."""
    from repro.core.sources import training_rows

    total = 0
    for i, src in enumerate(cfg.data.sources):
        if (n := training_rows(src, i)) is not None:
            total += n
        elif src.limit is not None:
            total += src.limit
        else:
            return None
    return total


@check
def check_ratio(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """selection.params.ratio is a percentage (CluSTER: 1-100), unlike selection.fraction (a
    share, 0-1); 0.5 is surely meant as 50."""
    r = cfg.selection.params.get("ratio")
    if r is None or isinstance(r, bool) or not isinstance(r, (int, float)):
        return []
    if 0 < r < 1:
        pct = r * 100
        return [
            Problem(
                "selection.params.ratio",
                f"{r:g} looks like a fraction; it is a percentage (0-100, unlike "
                "selection.fraction's 0-1 share), did you mean "
                f"{int(pct) if float(pct).is_integer() else round(pct, 4):g}?",
            )
        ]
    if r == 1:
        return [
            Problem(
                "selection.params.ratio",
                "1 keeps 1% of the smallest cluster per "
                "cluster (a percentage); the paper's r = 1.0 is ratio 100",
                blocking=False,
            )
        ]
    return []


@check
def check_world_size_fits_profile(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """When launching: the job's GPUs fill whole nodes of the cluster profile."""
    if ctx.profile is None:
        return []
    try:
        ctx.profile.nodes_for(cfg.world_size)
    except ConfigError as e:
        return [Problem("world_size", str(e))]
    return []


@check
def check_gpu_memory(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """When launching with a profile that states `gpu.memory_gb`: the cell's memory plan
    (repro/core/memory.py) fits one GPU; if not, what would make it fit."""
    gpu = getattr(ctx.profile, "gpu", None)
    limit = getattr(gpu, "memory_gb", None)
    host_limit = getattr(ctx.profile, "mem_per_gpu_gb", None)
    if limit is None and host_limit is None:
        return []
    from repro.core.memory import GIB, fit_advice, plan_for_config

    plan, advice = fit_advice(cfg, float(limit)) if limit is not None else (plan_for_config(cfg), None)
    if plan is None:
        return [
            Problem(
                "model.name_or_path",
                f"{cfg.model.name_or_path!r}: shape unknown here (not "
                "a known hub id nor a local directory with config.json), so its memory "
                "could not be planned",
                blocking=False,
            )
        ]
    out = [Problem("train.strategy", advice, kind="memory")] if advice else []
    if host_limit is not None and plan.host / GIB > host_limit:
        out.append(
            Problem(
                "model.name_or_path",
                f"each worker loads the whole fp32 model into host "
                f"memory first: {plan.host / GIB:.1f} GiB, more than the profile's "
                f"mem_per_gpu_gb = {host_limit:g}; raise mem_per_gpu_gb",
                kind="memory",
            )
        )
    return out


@check
def check_report_to(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """train.report_to: the tracker's package is installed (they are optional; tensorboard is
    the `tensorboard` extra), else the pip command that installs it."""
    from repro.core.tracking import missing_package

    problem = missing_package(cfg.train.report_to)
    return [Problem("train.report_to", problem)] if problem else []
