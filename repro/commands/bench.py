"""`cluster-repro bench WHAT`: the benchmarks, measured side by side in one run, as ratios.

paper-step, stragglers, balance, k-scaling and cluster with flags parse their own options
(`raw`, before argparse); ddp, features and plain cluster are parsed here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.core.errors import UserValueError


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

    p.set_defaults(func=_bench)


def raw(argv: list[str]) -> int | None:
    """The benches with their own flags: their exit status, or None for any other command line."""
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
