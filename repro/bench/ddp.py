"""`cluster-repro bench ddp`: DDP throughput and all-reduce wait as the world size grows.

    cluster-repro bench ddp [--config C] [--world-sizes 1,4,8] [--steps 6] [--per-device-batch 4]
        [--out runs/bench] [key.sub=value ...]

It trains the same config at several world sizes (weak scaling: the
per-worker batch is fixed, so the global batch grows with the world size) and reports tokens/s,
its ratio to world size 1, and the share of step time spent waiting at the gradient all-reduce.
The first `warmup` steps of each run are left out (allocator warm-up, lazy initialization).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from repro.core.argtypes import int_list, positive_int
from repro.core.io import atomic_write_json, read_jsonl


def step_stats(run_dir: Path, warmup: int = 1) -> dict[str, Any]:
    """Throughput from the per-rank step logs: a step lasts as long as its slowest worker."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for f in sorted((run_dir / "train_log").glob("rank*.jsonl")):
        for row in read_jsonl(f):
            by_step[row["step"]].append(row)
    steps = [s for s in sorted(by_step) if s >= warmup] or sorted(by_step)
    wall = sum(max(r["step_s"] for r in by_step[s]) for s in steps)
    tokens = sum(r["tokens"] for s in steps for r in by_step[s])
    wait = sum(r["allreduce_wait_s"] for s in steps for r in by_step[s])
    busy = sum(r["step_s"] for s in steps for r in by_step[s])
    return {
        "steps": len(steps),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall else None,
        "allreduce_wait_share": wait / busy if busy else None,
        "median_step_s": statistics.median(max(r["step_s"] for r in by_step[s]) for s in steps),
        "peak_mem_mb_per_worker": max(r["peak_mem_mb"] for s in steps for r in by_step[s]),
    }


def bench_ddp(
    config: str | None,
    world_sizes: list[int],
    steps: int,
    per_device_batch: int,
    output_dir: Path,
    overrides: list[str],
) -> list[dict[str, Any]]:
    from repro.core.config.load import load_config
    from repro.demo.run import demo_config
    from repro.pipeline import run_experiment

    rows = []
    for k in world_sizes:
        ov = [
            f"world_size={k}",
            f"train.per_device_batch_size={per_device_batch}",
            f"train.global_batch_size={per_device_batch * k}",
            f"train.max_steps={steps}",
            "train.checkpoint_every=0",
            "train.epochs=50",
            f"output_dir={output_dir}",
            "name=bench-ddp",
            *overrides,
        ]
        cfg = load_config(config, ov) if config else demo_config(quick=False, overrides=ov)
        t0 = time.perf_counter()
        run_dir = run_experiment(cfg, force=True, until="train")
        st = step_stats(run_dir)
        st.update(
            world_size=k,
            model=cfg.model.name_or_path,
            run_s=time.perf_counter() - t0,
            seq_len_max=cfg.data.max_length,
            per_device_batch=per_device_batch,
        )
        rows.append(st)
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["speedup_vs_first"] = r["tokens_per_s"] / base if base else None
    atomic_write_json(output_dir / "bench_ddp.json", rows)
    return rows


def format_ddp(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (reports/render.py computed_table)."""
    from reports.render import computed_table

    cols: list[tuple[str, Any]] = [
        ("model", lambda r: f"{r['model']}"),
        ("world size", lambda r: f"{r['world_size']}"),
        ("tokens/s", lambda r: f"{r['tokens_per_s']:.0f}"),
        ("x vs first", lambda r: f"{r['speedup_vs_first']:.2f}"),
        ("all-reduce wait share", lambda r: f"{100 * r['allreduce_wait_share']:.1f}%"),
        ("median step s", lambda r: f"{r['median_step_s']:.3f}"),
        ("peak MB/worker", lambda r: f"{r['peak_mem_mb_per_worker']:.0f}"),
    ]
    return computed_table(cols, rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="config to train (default: the demo config)")
    p.add_argument(
        "--world-sizes", type=int_list(lo=1), default="1,4,8", help="comma-separated (default 1,4,8)"
    )
    p.add_argument("--steps", type=positive_int, default=6, help="optimizer steps per run (default 6)")
    p.add_argument("--per-device-batch", type=positive_int, default=4, help="per-worker batch (default 4)")
    p.add_argument("--out", default="runs/bench", help="where the runs and bench_ddp.json go")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides for every run")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    rows = bench_ddp(args.config, args.world_sizes, args.steps, args.per_device_batch, out, args.overrides)
    print(format_ddp(rows))
    print(f"\n{out / 'bench_ddp.json'}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster-repro bench ddp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main())
