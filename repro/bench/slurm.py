"""Measure the launch path: one small cell through `launch --cluster slurm` vs `cluster-repro run`.

    python -m repro.bench.slurm [--world-size 4] [--repeats 3] [--profile configs/clusters/local.yaml]

Each repeat runs the quick demo's `full` cell twice, in fresh output folders (nothing skipped,
model cache warm), alternating the order: directly (`cluster-repro run`, workers spawned
locally) and through SLURM (`cluster-repro launch ... --wait`: sbatch, srun tasks, the job's own
imports, sacct polling). For the SLURM runs, accounting splits the wall time into the queue wait
(submit to start), the job itself (start to end) and the rest (the launcher's own start, its
submission and noticing the end). Prints a table and writes JSON (--out). Needs a running SLURM
(slurm/local/start.sh) and its SLURM_CONF.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from repro.core.argtypes import positive_int
from repro.core.io import atomic_write_json, read_json

ROOT = Path(__file__).resolve().parent.parent


def _grid(tmp: Path, world_size: int) -> Path:
    g = tmp / "bench.yaml"
    g.write_text(
        yaml.safe_dump(
            {
                "name": "bench",
                "base": str(ROOT / "configs" / "demo-quick.yaml"),
                "grid": {
                    "datasets": {"demo-pool": {}},  # the base's own source
                    "models": {"tiny": {}},
                    "methods": {"full": {"overrides": ["selection.method=full"]}},
                    "world_sizes": [world_size],
                    "seeds": [42],
                },
            }
        )
    )
    return g


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children and their children."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _job_cpu(job_id: str) -> float:
    """CPU seconds of all steps of a job, from accounting (TotalCPU, [DD-][HH:]MM:SS.fff)."""
    p = subprocess.run(
        ["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,TotalCPU"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    total = 0.0
    for line in p.stdout.splitlines():
        jid, _, cpu = line.partition("|")
        if "." not in jid or not cpu:  # steps only (the allocation line repeats their sum)
            continue
        days, _, rest = cpu.rpartition("-")
        parts = [float(x) for x in rest.split(":")]
        secs = sum(v * 60**i for i, v in enumerate(reversed(parts)))
        total += secs + (float(days) * 86400 if days else 0.0)
    return total


def _sacct_times(job_id: str) -> tuple[float, float, float]:
    """Submit, start and end of a job (epoch s); waits until accounting knows the end."""
    for _ in range(120):
        p = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "Submit,Start,End"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        fields = p.stdout.split("\n")[0].split("|")
        if len(fields) == 3 and "Unknown" not in fields:
            t = [dt.datetime.fromisoformat(x).timestamp() for x in fields]
            return t[0], t[1], t[2]
        time.sleep(0.5)
    raise RuntimeError(f"sacct has no end time for job {job_id}")


def _timed_cli(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """`python -m repro ARGS` from the repository root: (the finished process, its wall seconds,
    the CPU seconds of this process's children meanwhile)."""
    c0 = _children_cpu()
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "repro", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    return p, time.perf_counter() - t0, _children_cpu() - c0


def run_once(world_size: int, profile: str, how: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as d:
        tmp = Path(d)
        grid = _grid(tmp, world_size)
        out = tmp / "runs"
        env = {**os.environ, "CLUSTER_REPRO_NO_PROGRESS": "1"}
        if how == "direct":
            from repro.experiments.experiment import load_experiment

            cfg = tmp / "cell.yaml"
            cell = load_experiment(grid, [f"output_dir={out}"]).cells[0]
            cfg.write_text(yaml.safe_dump(cell.config().to_dict()))
            p, wall, cpu = _timed_cli(["run", str(cfg)], env)
            if p.returncode:
                raise RuntimeError(p.stderr[-3000:])
            return {"wall_s": wall, "cpu_s": cpu}
        launch = ["launch", str(grid), "--cluster", "slurm", "--profile", profile, "--results", str(out)]
        p, wall, launcher_cpu = _timed_cli([*launch, "--wait"], env)
        if p.returncode:
            raise RuntimeError(p.stdout[-2000:] + p.stderr[-3000:])
        job = next(iter(read_json(out / "_launch" / "bench" / "jobs.json")["jobs"].values()))
        sub, start, end = _sacct_times(job["job_id"])
        return {
            "wall_s": wall,
            "cpu_s": launcher_cpu + _job_cpu(job["job_id"]),
            "launcher_cpu_s": launcher_cpu,
            "queue_s": start - sub,
            "job_s": end - start,
            "other_s": wall - (end - sub),
        }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m repro.bench.slurm", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--world-size", type=positive_int, default=4)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--profile", default=str(ROOT / "configs" / "clusters" / "local.yaml"))
    ap.add_argument("--out", default="runs/bench_slurm.json", help="where the JSON goes")


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    rows: dict[str, list[dict[str, float]]] = {"direct": [], "slurm": []}
    for i in range(args.repeats):
        for how in ("direct", "slurm") if i % 2 == 0 else ("slurm", "direct"):
            r = run_once(args.world_size, args.profile, how)
            rows[how].append(r)
            print(
                f"repeat {i + 1} {how}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()),
                file=sys.stderr,
                flush=True,
            )
    med = {how: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for how, rs in rows.items()}
    over = med["slurm"]["wall_s"] - med["direct"]["wall_s"]
    print(f"world size {args.world_size}, {args.repeats} repeats, medians (s):")
    print(f"  direct (cluster-repro run)   wall {med['direct']['wall_s']:.1f}")
    print(
        f"  via SLURM (launch --wait)    wall {med['slurm']['wall_s']:.1f} = queue "
        f"{med['slurm']['queue_s']:.1f} + job {med['slurm']['job_s']:.1f} + launcher/polling "
        f"{med['slurm']['other_s']:.1f}"
    )
    print(f"  launch-path overhead         {over:+.1f} s ({over / med['direct']['wall_s']:+.0%})")
    print(
        f"  CPU seconds (user+sys)       direct {med['direct']['cpu_s']:.1f}, via SLURM "
        f"{med['slurm']['cpu_s']:.1f} (launcher {med['slurm']['launcher_cpu_s']:.1f})"
    )
    atomic_write_json(
        args.out,
        {
            "world_size": args.world_size,
            "repeats": args.repeats,
            "runs": rows,
            "median": med,
            "overhead_s": over,
        },
    )
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
