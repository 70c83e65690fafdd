"""`cluster-repro run | select | grid | validate`: running experiments in this process (the demo's
own command, `cluster-repro demo`, registers itself: repro/demo/cli.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro.core.config.builder import ConfigError
from repro.core.config.load import load_config
from repro.experiments.experiment import add_arguments, experiment_of


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        help="a YAML config file, or a shipped config by name, e.g. demo or "
        "mini/code (`cluster-repro ls configs`)",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="override any config key, e.g. train.epochs=2"
    )


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
        help="run every run and grid cell of an experiment file here, one after another",
        description="Run every experiment of an experiment file (its labelled runs: and the "
        "cells of its grid:; shipped ones in configs/experiments/) here, in this process, one "
        "after another, each with every stage of `cluster-repro run`. A run or method can take "
        "another's kept count (match_kept_count_of) or its compute (match_compute_of): it runs "
        "after that one. Every cell is checked before the first one runs. `cluster-repro "
        "launch` runs the same file's cells as jobs.",
        epilog=epilog,
    )
    add_arguments(p)
    p.add_argument("--force", action="store_true", help="redo every stage of every cell")
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
    from repro.experiments.inline import run_cells

    experiment, cells = experiment_of(args)
    print(summary_table(run_cells(experiment, cells, force=args.force)))
    return 0


def _config(args: argparse.Namespace):  # noqa: ANN202 (ExperimentConfig)
    """The config of `run`, `select` and `validate`; an experiment file given instead is named as one."""
    from repro.experiments.experiment import is_experiment_file

    try:
        return load_config(args.config, args.overrides)
    except ConfigError as e:
        if is_experiment_file(args.config):
            raise ConfigError(
                f"{e}. It is an experiment file (runs: and/or grid:): run its cells with "
                f"`cluster-repro grid {args.config}` here, or `cluster-repro launch {args.config}` as jobs"
            ) from None
        raise


def _run(args: argparse.Namespace) -> int:
    from repro.pipeline import run_experiment

    cfg = _config(args)
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

    from repro.core.config.schema import eval_hash

    cfg = _config(args)
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
    from repro.preflight import require_clean
    from repro.problems import report

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
