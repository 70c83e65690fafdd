"""`cluster-repro`: the command line. Each subcommand has --help.

cluster-repro demo [--quick]                  the embedded CPU mini-reproduction
cluster-repro run CONFIG [key.sub=value ...]  every stage of one experiment
cluster-repro select CONFIG [k=v ...]         stages up to the schedule (selection.csv)
cluster-repro grid RUNS_FILE [k=v ...]        every run of a run list (configs/runs/)
cluster-repro validate CONFIG [k=v ...]       load and preflight-check a config, print its hash
cluster-repro ls selectors|allocators|configs|formats|benchmarks|columns   what is available
cluster-repro results [--runs-dir DIR]        merge result part files into results.csv/.parquet
cluster-repro bench ddp [--world-sizes 1,4,8] DDP throughput and all-reduce wait
cluster-repro bench paper-step --shape S      the paper's step on a model shape: MFU, memory
cluster-repro bench stragglers                predicted straggler idle at the paper's step shape
cluster-repro bench balance [--config C]      token budgets and balance, trained side by side
cluster-repro bench k-scaling --features-dir D CluSTER's kept fraction as K grows to 256
cluster-repro report [--results DIR] [--out DIR] every table and figure from the results
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro.core.config import ConfigError, load_config, resolve_config_path
from repro.core.errors import UserValueError
from repro.core.rundir import RunStopped

EPILOG = (
    "Overrides use dotted keys, e.g. train.lr=1e-4 selection.fraction=0.5 world_size=8. "
    "Data files are read relative to data_dir (or $CLUSTER_REPRO_DATA)."
)


class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option, kept so existing scripts run: it stores into the new
    option's `dest` and prints a one-line note naming the new spelling (`new`)."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        print(f"note: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        help="a YAML config file, or a shipped config by name, e.g. demo or "
        "mini/code (`cluster-repro ls configs`)",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="override any config key, e.g. train.epochs=2"
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="cluster-repro",
        description="Reproduce and benchmark CluSTER (gradient-clustered data selection and "
        "worker-aware allocation for data-parallel fine-tuning).",
        epilog=EPILOG,
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "demo",
        help="run the CPU mini-reproduction on the generated demo pool",
        description="Fine-tune SmolLM2-135M-Instruct (LoRA) with 4 gloo DDP workers "
        "on the generated demo pool, once per method, and print the results table. "
        "docs/measurements.md gives its time on 2 cores; --quick uses a tiny random "
        "model instead.",
        epilog=EPILOG,
    )
    p.add_argument("--quick", action="store_true", help="tiny random model, small pool (for tests)")
    p.add_argument("--force", action="store_true", help="redo every stage even if its output exists")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key.sub=value",
        help="override demo config keys, e.g. output_dir=/tmp/demo",
    )

    for name, helptext in (
        ("run", "run every stage of one experiment (pool to results)"),
        ("select", "run the stages up to the schedule and write selection.csv"),
    ):
        p = sub.add_parser(name, help=helptext, description=helptext + ".", epilog=EPILOG)
        _add_config_args(p)
        p.add_argument(
            "--force",
            action="store_true",
            help="redo every stage even if its output exists (also when its inputs changed)",
        )
        p.add_argument(
            "--wait-lock",
            action="store_true",
            help="if another run of this config is writing its run folder, wait for "
            "it to finish instead of stopping",
        )

    p = sub.add_parser(
        "grid",
        help="run every run and cell of an experiment file here, in order",
        description="Run every experiment of an experiment file (its labelled `runs:` and the "
        "cells of its `grid:`; a run list of configs/runs/ or a grid file of configs/grids/ "
        "is one) here, in order, in this process; a run can take another's kept count "
        "(match_kept_count_of) or its compute (match_compute_of). `cluster-repro launch` runs "
        "the same file's cells as jobs (repro/experiments/experiment.py).",
        epilog=EPILOG,
    )
    p.add_argument(
        "runs_file",
        help="an experiment file (runs and/or grid), or a shipped one by name, e.g. "
        "runs/demo-grid (configs/runs/demo-grid.yaml)",
    )
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="overrides applied to every run")
    p.add_argument("--force", action="store_true", help="redo every stage of every run")
    p.add_argument(
        "--base",
        default=None,
        metavar="CONFIG",
        help="run every run on this base config instead of the run list's own, e.g. "
        "demo-quick (configs/demo-quick.yaml) for a quick pass of a demo grid",
    )

    p = sub.add_parser(
        "validate",
        help="load and check a config; print it and its hash",
        description="Load a config and check it before anything runs: keys, "
        "types and ranges, benchmark names, selector and allocator names and "
        "parameters, local data files, batch sizes, a ratio given as a fraction "
        "(repro/preflight.py). Prints the config, its hash (the run folder's "
        "name: what changes training) and its eval_hash; exits 2 on a problem.",
        epilog=EPILOG,
    )
    _add_config_args(p)
    p.add_argument("--quiet", action="store_true", help="print only the hash")

    p = sub.add_parser(
        "ls",
        help="list registered selectors, allocators, shipped configs, data formats, benchmarks or "
        "result columns",
        description="List what is available. selectors, allocators: each with its parameters, "
        "their types and defaults. columns: the result rows' columns (type, unit, meaning). "
        "formats: each data format with its "
        "fields (docs/byo-data.md). benchmarks: the built-in ones, those of "
        "installed packages and, with --task-path, those of task YAML folders "
        "(docs/add-a-benchmark.md).",
    )
    p.add_argument("what", choices=["selectors", "allocators", "configs", "formats", "benchmarks", "columns"])
    p.add_argument(
        "--task-path",
        action="append",
        default=[],
        metavar="DIR",
        help="benchmarks: also list the tasks of this folder of lm-eval task YAMLs "
        "(as eval.task_paths; repeatable)",
    )

    p = sub.add_parser(
        "bench",
        help="benchmarks: ddp, features, cluster (side by side, as ratios)",
        description="Benchmarks, measured side by side in one run, as ratios. "
        "ddp: throughput and all-reduce wait vs world size. features: the lean vs "
        "naive gradient-proxy features vs a plain forward pass. cluster: k-means + "
        "soft cap + selection at the paper's pool size, exact vs fast.",
    )
    p.add_argument(
        "what",
        choices=["ddp", "features", "cluster", "paper-step", "stragglers", "balance", "k-scaling"],
        help="paper-step: the paper recipe's training step and feature pass on a "
        "published model shape, with MFU and peak memory vs the memory plan "
        "(`cluster-repro bench paper-step --help`). stragglers: the predicted idle "
        "share at the paper's step shape from real lengths and clusters, no training "
        "(`... bench stragglers --help`). balance: CluSTER with example vs token "
        "budgets and balance, and random allocation, trained side by side "
        "(`... bench balance --help`). k-scaling: CluSTER's selection at K = 4..256 "
        "workers, with clusters_per_worker C = 1, 2, 4 (`... bench k-scaling --help`)",
    )
    p.add_argument("--config", default=None, help="config to train (default: the demo config)")
    p.add_argument("--world-sizes", default="1,4,8", help="comma-separated (default 1,4,8)")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run (default 6)")
    p.add_argument("--per-device-batch", type=int, default=4, help="per-worker batch (default 4)")
    p.add_argument("--output-dir", default="runs/bench", help="where runs and bench_ddp.json go")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value")

    p = sub.add_parser("results", help="merge every run's result part file into one CSV + Parquet")
    p.add_argument(
        "--runs-dir",
        default="runs",
        help="the folder the runs wrote to, i.e. their config's output_dir, read here (default: runs)",
    )
    p.add_argument(
        "--output-dir",
        dest="runs_dir",
        action=_DeprecatedAlias,
        new="--runs-dir",
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    p.add_argument("--out", default=None, help="merged CSV path (default: RUNS_DIR/results.csv)")
    p.add_argument(
        "--allow-damaged",
        action="store_true",
        help="merge the intact part files and leave out damaged ones (cut, or not "
        "matching their checksum), naming each; without it a damaged part stops "
        "the merge with exit status 2",
    )

    # Subcommands owned by other packages (eval, launch/status, report): each such module has
    # `register(subparsers, epilog)` that adds its parsers and sets `func(args) -> int` on them.
    for module in PLUGIN_MODULES:
        mod = _import_optional(module)
        if mod is not None:
            mod.register(sub, EPILOG)
    return ap


PLUGIN_MODULES = ("evals.cli", "slurm.cli", "reports.cli")


def _import_optional(module: str):
    """The module, or None when it does not exist yet; any other import error propagates."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise


def _cmd_ls(what: str, task_paths: list[str]) -> int:
    from repro.core.registry import ALLOCATORS, SELECTORS

    if what == "columns":
        from repro.core.schema import markdown_table

        print(markdown_table(), end="")
        return 0
    if what == "formats":
        from repro.core.prompts import DETECT_ORDER, FORMATS

        for f in FORMATS.values():
            print(f"{f.describe()}\n    {f.about}")
        print(f"auto: the first of {', '.join(DETECT_ORDER)} whose required fields the first row has")
        return 0
    if what == "benchmarks":
        from evals.run import known_benchmarks

        for b in known_benchmarks(task_paths).values():
            print(
                f"{b.name:20s} {b.kind:8s} {','.join(b.metrics):16s} lm-eval task "
                f"{b.task_name('<source>')}  [{b.origin}]"
            )
        return 0
    if what == "configs":  # every name works as CONFIG, RUNS_FILE, GRID or --profile anywhere
        from repro.core.config import SHIPPED_CONFIGS, shipped_configs

        for name in shipped_configs():
            first = (SHIPPED_CONFIGS / f"{name}.yaml").read_text(encoding="utf-8").splitlines()[:1]
            print(f"{name:24s} {first[0].lstrip('# ') if first else ''}")
        return 0
    reg = SELECTORS if what == "selectors" else ALLOCATORS
    for name in reg.names():
        obj = reg.get(name)
        doc = (obj.__doc__ or "").strip().splitlines()
        print(f"{name}  [{reg.origin(name)}]\n    {doc[0] if doc else ''}")
        for line in reg.parameters(name) or ["(no parameters)"]:
            print(f"      {line}")
    return 0


def _preflight(where: str, cfg) -> None:
    """Check the config before any stage runs (repro/preflight.py): a problem raises a
    ConfigError listing each with its key; notes (what cannot be checked here) go to stderr."""
    from repro.preflight import report, require_clean

    found = require_clean([(where, cfg)])
    if any(found.values()):
        print(report(found), file=sys.stderr)


def _memory_line(cfg) -> str:
    """The memory plan of the config's training, per worker (repro/core/memory.py)."""
    from repro.core.memory import plan_for_config

    gpu, cpu = plan_for_config(cfg, device="cuda"), plan_for_config(cfg, device="cpu")
    if gpu is None or cpu is None:
        return (
            f"memory plan: unknown ({cfg.model.name_or_path!r} is not a known shape nor a "
            "local directory with config.json)"
        )
    return (
        f"memory plan per worker ({cfg.train.strategy}, world size {cfg.world_size}"
        f"{', activation checkpointing' if cfg.train.activation_checkpointing else ''}): "
        f"GPU {gpu.required_gib():.1f} GiB (peak {gpu.peak_gib:.1f} allocated + slack + "
        f"context), CPU {cpu.required_gib():.2f} GiB RSS; launch checks it against the "
        "profile's gpu.memory_gb"
    )


def _idle_line(run_dir: Path) -> str | None:
    """The predicted straggler idle share that the run folder's schedule stage recorded
    (repro/core/steps.py), or None before that stage or with one worker."""
    from repro.core.io import read_json
    from repro.core.rundir import stage_marker

    marker = stage_marker(run_dir, "schedule")
    info = read_json(marker) if marker.is_file() else {}
    share = info.get("predicted_idle_share")
    if share is None:
        return None
    workers = " ".join(f"{100 * w:.1f}%" for w in info.get("worker_idle_shares") or [])
    steps = (info.get("derived") or {}).get("total_steps")
    return (
        f"predicted idle share: {100 * share:.1f}% of each optimizer step, mean over {steps} "
        f"steps (per worker: {workers}; from the schedule and token counts, "
        f"{run_dir / 'step_tokens.json'})"
    )


def main(argv: list[str] | None = None) -> int:
    """The command, inside the one top-level handler (`environment_errors`): errors of the
    machine (no space, read-only, not a directory, permission) and SIGTERM / Ctrl-C end in one
    line naming the path and the fix, never a traceback."""
    import signal

    def on_sigterm(signum: int, frame: object) -> None:
        raise Interrupted("SIGTERM", 143)

    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread (a test calling main in a thread): keep the default
        previous = None
    try:
        return _dispatch(argv)
    except Interrupted as e:
        _stop_workers()
        print(f"interrupted ({e.args[0]}): {_RESUME}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        _stop_workers()
        print(f"interrupted (Ctrl-C): {_RESUME}", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"error: {environment_message(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the last resort: one line, the traceback in a file
        return _internal_error(e)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_RESUME = (
    "the attempt is recorded as interrupted in the run folder's stages/attempts.json; finished "
    "stages and checkpoints are kept: run the same command again to resume"
)


class Interrupted(BaseException):
    """SIGTERM, as an exception: not an Exception, so a stage records 'interrupted' (pipeline)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(what)
        self.code = code


def _stop_workers() -> None:
    """End the worker processes this process spawned (training, features, eval), quietly."""
    import multiprocessing as mp

    children = mp.active_children()
    for c in children:
        c.terminate()
    for c in children:
        c.join(timeout=5)
        if c.is_alive():
            c.kill()


# errno -> what it means for the user, and the fix
_ENV_FIXES = {
    28: (
        "no space left on the device",
        "free space there (df -h) or set output_dir to another disk, then run the same "
        "command again to resume",
    ),
    122: (
        "the disk quota is exceeded",
        "free space or set output_dir elsewhere, then run the same command again to resume",
    ),
    30: ("the filesystem is read-only", "set output_dir (or --out) to a writable folder"),
    13: (
        "permission denied",
        "make it writable for this user (chmod/chown) or set output_dir (or --out) to a folder you own",
    ),
    1: ("operation not permitted", "make it writable for this user or set output_dir (or --out) elsewhere"),
    20: ("a part of the path is a file, not a folder", "remove or rename that file, or choose another path"),
    21: ("it is a folder where a file is expected", "remove or rename that folder, or choose another path"),
    17: ("it exists and is a file where a folder is needed", "remove or rename it, or choose another path"),
    2: ("no such file or folder", "check the path"),
    24: ("too many open files", "raise the limit (ulimit -n) and run again"),
}


def environment_message(e: OSError) -> str:
    """One line for an OSError: what, the path (or where the run writes), the fix."""
    what, fix = _ENV_FIXES.get(
        e.errno or -1, (e.strerror or type(e).__name__, "check the path and the machine")
    )
    path = e.filename
    if path is None:
        where = "(the library did not name the file)"
    else:
        where = f"{path}" + (f" -> {e.filename2}" if e.filename2 else "")
    if e.errno == 2 and path is None:
        return f"{e}"
    return f"{where}: {what} [Errno {e.errno}]; {fix}"


def _internal_error(e: BaseException) -> int:
    """An error the suite did not expect: one line, the traceback in a file."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(e))
    last = str(e).strip().splitlines()
    # A worker's exception (torch's ProcessRaisedException) carries the worker's traceback as
    # its message: its last line is the error.
    msg = last[-1] if last else ""
    import re

    m = re.search(r"\[Errno (\d+)\] ([^:']*)(?:: '([^']*)')?", msg)
    if m and int(m.group(1)) in _ENV_FIXES:  # an environment error inside a worker process
        err = OSError(int(m.group(1)), m.group(2), m.group(3))
        print(f"error: in a worker process: {environment_message(err)}", file=sys.stderr)
        return 2
    try:
        fd, path = tempfile.mkstemp(prefix="cluster-repro-traceback-", suffix=".txt")
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        where = f"the traceback is in {path}"
    except OSError:
        where = "the traceback could not be saved"
    print(
        f"error: {type(e).__name__}: {msg} ({where}; an unexpected error in cluster-repro or a "
        "plugin: please report it with that file)",
        file=sys.stderr,
    )
    return 1


def _dispatch(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "paper-step"]:  # its own flags (repro/bench/paper_step.py)
        from repro.bench.paper_step import main as paper_step

        return paper_step(argv[2:])
    if argv[:2] == ["bench", "stragglers"]:  # its own flags (repro/bench/stragglers.py)
        from repro.bench.stragglers import main as stragglers

        return stragglers(argv[2:])
    if argv[:2] == ["bench", "balance"]:  # its own flags (repro/bench/balance.py)
        from repro.bench.balance import main as balance

        return balance(argv[2:])
    if argv[:2] == ["bench", "cluster"] and len(argv) > 2:  # its flags (repro/bench/cluster.py)
        from repro.bench.cluster import main as bench_cluster_main

        bench_cluster_main(argv[2:])
        return 0
    if argv[:2] == ["bench", "k-scaling"]:  # its own flags (repro/bench/k_scaling.py)
        from repro.bench.k_scaling import main as k_scaling

        return k_scaling(argv[2:])
    parser = build_parser()
    # Overrides may come before or after flags (`validate CONFIG --quiet k=v`): argparse stops
    # filling a trailing nargs="*" positional at the first flag, so collect the rest here.
    args, extra = parser.parse_known_args(argv)
    bad = [x for x in extra if x.startswith("-") or "=" not in x or not hasattr(args, "overrides")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        if getattr(args, "func", None) is not None:
            return int(args.func(args) or 0)
        if args.cmd == "demo":
            from repro.demo import run_demo, summary_table

            run_dirs, merged = run_demo(quick=args.quick, overrides=args.overrides, force=args.force)
            print(summary_table(run_dirs))
            print(f"\nResults: {merged} (one row per run, benchmark and metric); run folders:")
            for d in run_dirs:
                print(f"  {d}")
            from repro.demo import write_demo_report  # the report: tables and figures (reports/)

            print(f"\nReport (tables, figures, index page): {write_demo_report(run_dirs, merged)}")
            return 0
        if args.cmd == "grid":
            from repro.demo import summary_table
            from repro.experiments.experiment import has_grid, load_experiment, run_cells
            from repro.experiments.runlists import load_run_list, run_list

            if has_grid(args.runs_file):  # a grid part: its cells, here, one after another
                if args.base:
                    raise ConfigError("--base: replaces a run list's base; a grid names its own in the file")
                run_dirs = run_cells(load_experiment(args.runs_file, args.overrides), force=args.force)
            else:
                rl = load_run_list(args.runs_file)
                if args.base:
                    rl.base = resolve_config_path(args.base, "--base").resolve()
                run_dirs = run_list(rl, args.overrides, force=args.force)
            print(summary_table(run_dirs))
            return 0
        if args.cmd in ("run", "select"):
            from repro.pipeline import run_experiment

            cfg = load_config(args.config, args.overrides)
            _preflight(args.config, cfg)
            run_dir = run_experiment(
                cfg,
                force=args.force,
                wait_lock=args.wait_lock,
                until="results" if args.cmd == "run" else "schedule",
            )
            line = _idle_line(run_dir)
            if line:
                print(line, file=sys.stderr)
            what = "results.part.csv" if args.cmd == "run" else "selection.csv"
            print(f"{run_dir / what}")
            return 0
        if args.cmd == "validate":
            import yaml

            from repro.core.config import eval_hash

            cfg = load_config(args.config, args.overrides)
            _preflight(args.config, cfg)
            if not args.quiet:
                print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
                print(f"eval_hash: {eval_hash(cfg)}  (the eval settings; not part of config_hash)")
                print(_memory_line(cfg))
                if cfg.world_size > 1:
                    print(
                        _idle_line(cfg.run_dir())
                        or "predicted idle share: not known yet "
                        "(`cluster-repro select` computes it from the selection's schedule)"
                    )
            print(f"config_hash: {cfg.hash()}")
            return 0
        if args.cmd == "ls":
            return _cmd_ls(args.what, args.task_path)
        if args.cmd == "bench" and args.what == "features":
            from repro.bench.features import bench_features, format_features
            from repro.core.config import LoraConfig, ModelConfig
            from repro.core.models import materialize_model

            model_dir = materialize_model(ModelConfig(lora=LoraConfig(enabled=False)), seed=0)
            print(format_features(bench_features(model_dir)))
            return 0
        if args.cmd == "bench" and args.what == "cluster":
            from repro.bench.cluster import bench_cluster, format_cluster

            print(format_cluster(bench_cluster()))
            return 0
        if args.cmd == "bench":
            from repro.bench.ddp import bench_ddp, format_ddp

            try:
                sizes = [int(x) for x in args.world_sizes.split(",")]
            except ValueError:
                raise UserValueError(
                    f"--world-sizes {args.world_sizes!r}: expected comma-separated integers, e.g. 1,4,8"
                ) from None
            if min(sizes) < 1 or args.steps < 1 or args.per_device_batch < 1:
                raise UserValueError("--world-sizes, --steps and --per-device-batch must be >= 1")
            rows = bench_ddp(
                args.config, sizes, args.steps, args.per_device_batch, Path(args.output_dir), args.overrides
            )
            print(format_ddp(rows))
            print(f"\n{Path(args.output_dir) / 'bench_ddp.json'}")
            return 0
        if args.cmd == "results":
            from repro.core.results import merge_results

            path, n = merge_results(
                Path(args.runs_dir), Path(args.out) if args.out else None, allow_damaged=args.allow_damaged
            )
            print(f"{path} ({n} rows); also {path.with_suffix('.parquet')}")
            return 0
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except RunStopped as e:  # locked, inputs changed (2), training diverged (3)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except _user_errors() as e:
        # ConfigError, DataError, SelectionError, ...: messages that name the file or key.
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message names the file or key and the fix: printed, exit status 2. Any other
    exception (a ValueError of the suite's own code among them) is a bug: main() reports it as one,
    exit status 1, with its traceback kept (repro/core/errors.py)."""
    from repro.core.errors import UserError

    return (UserError, FileNotFoundError)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
