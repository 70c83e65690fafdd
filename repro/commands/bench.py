"""`cluster-repro bench WHAT`: the benchmarks, measured side by side in one run, as ratios.

paper-step, stragglers, balance, k-scaling and cluster with flags parse their own options
(`raw`, before argparse); ddp, features and plain cluster are parsed here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro.core.argtypes import int_list, positive_int
from repro.core.config import ConfigError
from repro.core.errors import UserError


def register(sub: argparse._SubParsersAction, epilog: str) -> None:  # noqa: ARG001 (own flags)
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
        choices=["ddp", "features", "cluster", "paper-step", "stragglers", "balance", "k-scaling", "padding"],
        help="paper-step: the paper recipe's training step and feature pass on a "
        "published model shape, with MFU and peak memory vs the memory plan "
        "(`cluster-repro bench paper-step --help`). stragglers: the predicted idle "
        "share at the paper's step shape from real lengths and clusters, no training "
        "(`... bench stragglers --help`). balance: CluSTER with example vs token "
        "budgets and balance, and random allocation, trained side by side "
        "(`... bench balance --help`). k-scaling: CluSTER's selection at K = 4..256 "
        "workers, with clusters_per_worker C = 1, 2, 4 (`... bench k-scaling --help`). "
        "padding: a config's padded tokens per step shape, plain and length-grouped, no "
        "training (`... bench padding --help`)",
    )
    p.add_argument("--config", default=None, help="config to train (default: the demo config)")
    p.add_argument(
        "--world-sizes", type=int_list(lo=1), default="1,4,8", help="comma-separated (default 1,4,8)"
    )
    p.add_argument("--steps", type=positive_int, default=6, help="optimizer steps per run (default 6)")
    p.add_argument("--per-device-batch", type=positive_int, default=4, help="per-worker batch (default 4)")
    p.add_argument("--output-dir", default="runs/bench", help="where runs and bench_ddp.json go")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value")

    p.set_defaults(func=_bench)


def raw(argv: list[str]) -> int | None:
    """The benches with their own flags: their exit status, or None for any other command line.
    Their flags' ranges are checked by their parsers (exit 2); a user's mistake found later (a
    config key, a data file) is one line, exit 2, as for every other command."""
    try:
        return _raw(argv)
    except UserError as e:
        print(f"{'config ' if isinstance(e, ConfigError) else ''}error: {e}", file=sys.stderr)
        return 2


def _raw(argv: list[str]) -> int | None:
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
    if argv[:2] == ["bench", "padding"]:  # its own flags (repro/bench/padding.py)
        from repro.bench.padding import main as padding

        return padding(argv[2:])
    if argv[:2] == ["bench", "k-scaling"]:  # its own flags (repro/bench/k_scaling.py)
        from repro.bench.k_scaling import main as k_scaling

        return k_scaling(argv[2:])
    return None


def _bench(args: argparse.Namespace) -> int:
    if args.what == "features":
        from repro.bench.features import bench_features, format_features
        from repro.core.config import LoraConfig, ModelConfig
        from repro.core.models import materialize_model

        model_dir = materialize_model(ModelConfig(lora=LoraConfig(enabled=False)), seed=0)
        print(format_features(bench_features(model_dir)))
        return 0
    if args.what == "cluster":
        from repro.bench.cluster import bench_cluster, format_cluster

        print(format_cluster(bench_cluster()))
        return 0
    from repro.bench.ddp import bench_ddp, format_ddp

    rows = bench_ddp(
        args.config,
        args.world_sizes,
        args.steps,
        args.per_device_batch,
        Path(args.output_dir),
        args.overrides,
    )
    print(format_ddp(rows))
    print(f"\n{Path(args.output_dir) / 'bench_ddp.json'}")
    return 0
