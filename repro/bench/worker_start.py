"""How long a local launch of W workers takes to start: spawn (each worker imports fresh) against
the fork server (repro/core/distributed.py: one process imports once, workers are forked from it).

Each worker imports what a training worker imports (repro.trainer), joins the gloo group and
does one all-reduce: the fixed cost every feature pass and training launch pays before any work.
The two start methods are measured side by side in one run, alternating, each launch from this
one process (as a run's stages launch theirs); the first fork-server launch also starts the
server, so it is reported apart from the later ones.

    python -m repro.bench.worker_start --world-size 4 --launches 3 [--out out.json]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from typing import Any

from repro.core.argtypes import positive_int


def _worker(rank: int, world_size: int) -> None:
    import torch
    import torch.distributed as dist

    import repro.trainer  # noqa: F401 - what a training worker imports

    t = torch.ones(1)
    dist.all_reduce(t)
    assert int(t.item()) == world_size


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _launch(method: str, world_size: int) -> tuple[float, float]:
    from repro.core.distributed import spawn_workers

    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    spawn_workers(_worker, world_size, method=method)
    return time.perf_counter() - t0, _children_cpu_s() - cpu0


def bench_worker_start(world_size: int = 4, launches: int = 3) -> list[dict[str, Any]]:
    """Per start method: the first launch's seconds and the median of the later ones (wall), and
    the CPU seconds of the reaped children (spawn's workers; the fork server's own CPU is counted
    when it exits, at the end of this process, so its rows give the workers' only)."""
    times: dict[str, list[tuple[float, float]]] = {"spawn": [], "forkserver": []}
    for _ in range(launches):
        for method in ("spawn", "forkserver"):
            times[method].append(_launch(method, world_size))
    rows = []
    for method, ts in times.items():
        later = [w for w, _ in ts[1:]] or [ts[0][0]]
        rows.append(
            {
                "method": method,
                "world_size": world_size,
                "launches": len(ts),
                "first_s": ts[0][0],
                "later_median_s": statistics.median(later),
                "cpu_s_per_launch": statistics.median(c for _, c in ts),
            }
        )
    base = rows[0]["later_median_s"]
    for r in rows:
        r["later_vs_spawn"] = r["later_median_s"] / base if base else None
    return rows


def format_worker_start(rows: list[dict[str, Any]]) -> str:
    from reports.render import plain_table

    return plain_table(
        [
            ("start method", "method", "{}"),
            ("workers", "world_size", "{}"),
            ("launches", "launches", "{}"),
            ("first launch (s)", "first_s", "{:.2f}"),
            ("later launches, median (s)", "later_median_s", "{:.2f}"),
            ("vs spawn", "later_vs_spawn", "{:.3f}"),
            ("reaped CPU s per launch", "cpu_s_per_launch", "{:.1f}"),
        ],
        rows,
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m repro.bench.worker_start",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--world-size", type=positive_int, default=4)
    ap.add_argument("--launches", type=positive_int, default=3, help="launches per start method (default 3)")
    ap.add_argument("--out", default=None, help="also write the rows here (JSON)")


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(a: argparse.Namespace) -> int:
    rows = bench_worker_start(a.world_size, a.launches)
    print(format_worker_start(rows))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.out:
        from repro.core.io import atomic_write_json

        atomic_write_json(a.out, {"rows": rows, "loadavg": os.getloadavg()})
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
