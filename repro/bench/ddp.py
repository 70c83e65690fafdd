"""Benchmarks (not tests): measured side by side in one run and reported as ratios.

`cluster-repro bench ddp` trains the same config at several world sizes (weak scaling: the
per-worker batch is fixed, so the global batch grows with the world size) and reports tokens/s,
its ratio to world size 1, and the share of step time spent waiting at the gradient all-reduce.
The first `warmup` steps of each run are left out (allocator warm-up, lazy initialization).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

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
    from repro.core.config import load_config
    from repro.demo import demo_config
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


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(step_stats(Path(".")), indent=2))
