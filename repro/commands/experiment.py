"""`cluster-repro run | select | grid | validate`: running experiments in this process (the demo's
own command, `cluster-repro demo`, registers itself: repro/demo/cli.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro.commands import add_config_args
from repro.core.config import ConfigError, load_config, resolve_config_path


def register(sub: argparse._SubParsersAction, epilog: str) -> None:
    for name, helptext in (
        ("run", "run every stage of one experiment (pool to results)"),
        ("select", "run the stages up to the schedule and write selection.csv"),
    ):
        p = sub.add_parser(name, help=helptext, description=helptext + ".", epilog=epilog)
        add_config_args(p)
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
        p.set_defaults(func=_run)

    p = sub.add_parser(
        "grid",
        help="run every run and cell of an experiment file here, in order",
        description="Run every experiment of an experiment file (its labelled `runs:` and the "
        "cells of its `grid:`; a run list of configs/runs/ or a grid file of configs/grids/ "
        "is one) here, in order, in this process; a run can take another's kept count "
        "(match_kept_count_of) or its compute (match_compute_of). `cluster-repro launch` runs "
        "the same file's cells as jobs (repro/experiments/experiment.py).",
        epilog=epilog,
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
    p.set_defaults(func=_grid)

    p = sub.add_parser(
        "validate",
        help="load and check a config; print it and its hash",
        description="Load a config and check it before anything runs: keys, "
        "types and ranges, benchmark names, selector and allocator names and "
        "parameters, local data files, batch sizes, a ratio given as a fraction "
        "(repro/preflight.py). Prints the config, its hash (the run folder's "
        "name: what changes training) and its eval_hash; exits 2 on a problem.",
        epilog=epilog,
    )
    add_config_args(p)
    p.add_argument("--quiet", action="store_true", help="print only the hash")
    p.set_defaults(func=_validate)


def _grid(args: argparse.Namespace) -> int:
    from repro.demo.run import summary_table
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


def _run(args: argparse.Namespace) -> int:
    from repro.pipeline import run_experiment

    cfg = load_config(args.config, args.overrides)
    preflight(args.config, cfg)
    run_dir = run_experiment(
        cfg,
        force=args.force,
        wait_lock=args.wait_lock,
        until="results" if args.cmd == "run" else "schedule",
    )
    line = idle_line(run_dir)
    if line:
        print(line, file=sys.stderr)
    what = "results.part.csv" if args.cmd == "run" else "selection.csv"
    print(f"{run_dir / what}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    import yaml

    from repro.core.config import eval_hash

    cfg = load_config(args.config, args.overrides)
    preflight(args.config, cfg)
    if not args.quiet:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        print(f"eval_hash: {eval_hash(cfg)}  (the eval settings; not part of config_hash)")
        print(memory_line(cfg))
        if cfg.world_size > 1:
            print(
                idle_line(cfg.run_dir())
                or "predicted idle share: not known yet "
                "(`cluster-repro select` computes it from the selection's schedule)"
            )
    print(f"config_hash: {cfg.hash()}")
    return 0


def preflight(where: str, cfg) -> None:
    """Check the config before any stage runs (repro/preflight.py): a problem raises a
    ConfigError listing each with its key; notes (what cannot be checked here) go to stderr."""
    from repro.preflight import report, require_clean

    found = require_clean([(where, cfg)])
    if any(found.values()):
        print(report(found), file=sys.stderr)


def memory_line(cfg) -> str:
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


def idle_line(run_dir: Path) -> str | None:
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
