"""Benchmark: selection time and peak memory of every selector on one config's pool.

    python -m repro.bench.selectors configs/mini/code.yaml data_dir=DATA_DIR \
        --methods random,dedup-exact,loss --out runs/bench/selectors-code.json [key=value ...]

For each method: one process runs the pipeline up to the pool stage (shared by every method: the
model and pool stages do not depend on the method, so they are cached in the first method's run
directory and copied), then a FRESH process runs the select stage alone, so its peak resident
memory (ru_maxrss, MiB) is the selector's plus the Python/torch import floor, which the `random`
row shows. CluSTER-feature selectors (`cluster`, `uniform`) also report their feature workers'
peak (features.json). Times are the select stage's wall seconds (stages/select.json
`selection_s`), the load average when each started is printed, since other jobs on the machine
inflate every time. Budget: selection.fraction (default 0.5) for selectors that take one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from repro.core.argtypes import fraction, str_list

SELF_COUNTED = {"full", "cluster", "uniform"}
DEFAULT_METHODS = (
    "random",
    "dedup-exact",
    "dedup-minhash",
    "semdedup",
    "loss",
    "perplexity",
    "ccs",
    "ifd",
    "grand",
    "less",
    "s2l",
    "uniform",
    "cluster",
)
# Parameters for the benchmark (each documented in docs/baselines.md next to the table).
DEFAULT_PARAMS = {"cluster": ["selection.params.ratio=50"]}

_STAGE = """
import sys
from repro.core.config.load import load_config
from repro.pipeline import run_experiment
cfg = load_config(sys.argv[1], sys.argv[3:])
run_experiment(cfg, until=sys.argv[2])
print(cfg.run_dir())
"""


def _run(config: str, until: str, overrides: list[str]) -> Path:
    env = {**os.environ, "CLUSTER_REPRO_NO_PROGRESS": "1"}
    p = subprocess.run(
        [sys.executable, "-c", _STAGE, config, until, *overrides], capture_output=True, text=True, env=env
    )
    if p.returncode != 0:
        raise RuntimeError(f"{until} failed for {overrides}:\n{p.stderr[-3000:]}")
    return Path(p.stdout.strip().splitlines()[-1])


def bench_selectors(
    config: str,
    methods: list[str],
    overrides: list[str],
    fraction: float,
    extra: dict[str, list[str]] | None = None,
) -> list[dict]:
    """One row per method: selection_s, peak_mem_mb (select process), n_pool, n_selected."""
    rows = []
    shared: Path | None = None
    for m in methods:
        ov = [*overrides, f"selection.method={m}", *(DEFAULT_PARAMS.get(m, [])), *((extra or {}).get(m, []))]
        if m not in SELF_COUNTED:
            ov.append(f"selection.fraction={fraction}")
        from repro.core.config.load import load_config

        run_dir = load_config(config, ov).run_dir()
        if not (run_dir / "stages" / "pool.json").is_file():
            if shared is None:
                shared = _run(config, "pool", ov)
            else:  # same pool and model for every method: reuse the first one's files
                (run_dir / "stages").mkdir(parents=True, exist_ok=True)
                for f in ("pool.jsonl", "heldout.jsonl", "stages/pool.json", "stages/model.json"):
                    shutil.copy(shared / f, run_dir / f)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        try:
            _run(config, "select", ov)
        except RuntimeError as e:  # one selector's failure (e.g. a pool too small) ends only its row
            row = {
                "method": m,
                "error": str(e).strip().splitlines()[-1],
                "load1_at_start": round(load, 2),
                "run_dir": str(run_dir),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
            continue
        wall = time.perf_counter() - t0
        sel = json.loads((run_dir / "stages" / "select.json").read_text())
        row = {
            "method": m,
            "n_pool": sel["n_pool"],
            "n_selected": sel["n_selected"],
            "n_unique": sel["n_unique"],
            "selection_s": round(sel["selection_s"], 2),
            "process_wall_s": round(wall, 2),
            "peak_mem_mb": round(sel["peak_mem_mb"], 1),
            "load1_at_start": round(load, 2),
            "run_dir": str(run_dir),
        }
        feats = run_dir / "features.json"
        if feats.is_file():
            row["feature_workers_peak_mem_mb"] = round(json.loads(feats.read_text())["peak_mem_mb"], 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    head = "| selector | pool | kept | selection s | peak MiB (select process) | load avg |"
    out = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['method']} | failed: {r['error']} | | | | {r['load1_at_start']:.1f} |")
            continue
        mem = f"{r['peak_mem_mb']:,.0f}"
        if r.get("feature_workers_peak_mem_mb"):
            mem += f" (feature workers {r['feature_workers_peak_mem_mb']:,.0f})"
        out.append(
            f"| {r['method']} | {r['n_pool']} | {r['n_selected']} | {r['selection_s']:.1f} "
            f"| {mem} | {r['load1_at_start']:.1f} |"
        )
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m repro.bench.selectors",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", metavar="key.sub=value")
    ap.add_argument(
        "--methods", type=str_list(), default=",".join(DEFAULT_METHODS), help="selectors, comma-separated"
    )
    ap.add_argument("--fraction", type=fraction, default=0.5, help="budget fraction (default 0.5)")
    ap.add_argument(
        "--params", default=None, help='JSON {"method": ["selection.params.x=1", ...]} of extra overrides'
    )
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    extra = json.loads(args.params) if args.params else None
    rows = bench_selectors(args.config, args.methods, args.overrides, args.fraction, extra)
    print(format_rows(rows))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
