"""`cluster-repro bench balance`: CluSTER's budget in examples or in tokens, its steps balanced in
examples or in tokens, and random allocation of its examples, trained side by side in one run.

    cluster-repro bench balance [--config configs/demo.yaml] [--ratio 50] [--force]
        [--out runs/bench-balance] [key.sub=value ...]

Five runs of the config (each through every stage, pool and features shared with the first):

    cluster                 selection cluster at --ratio, cluster-interleave, rank weights
    cluster+balance         + allocation.params.balance: tokens
    cluster-tokens          + selection.params.budget_unit: tokens
    cluster-tokens+balance  + both
    random-allocation       CluSTER's examples (examples budget) dealt by uniform-shuffle

For each: the kept examples and tokens, optimizer steps, the predicted idle share (from the
schedule, before training), the measured all-reduce wait share, the training time (and its ratio
to plain CluSTER's) and the held-out loss. Writes bench_balance.json and bench_balance.md to
--out. The times are wall-clock measurements: run it on an otherwise idle machine, e.g.
with configs/demo.yaml, configs/mini/code.yaml and configs/mini/medical.yaml (data_dir=...).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from repro.core.argtypes import percent
from repro.core.config.builder import ConfigError
from repro.core.config.load import load_config
from repro.core.interfaces import SelectionError
from repro.core.io import atomic_write_json, atomic_write_text, read_json
from repro.core.results import PART_NAME, provenance, read_rows
from repro.core.rundir import RunStopped, stage_marker

VARIANTS: list[tuple[str, list[str]]] = [
    ("cluster", []),
    ("cluster+balance", ["allocation.params.balance=tokens"]),
    ("cluster-tokens", ["selection.params.budget_unit=tokens"]),
    ("cluster-tokens+balance", ["selection.params.budget_unit=tokens", "allocation.params.balance=tokens"]),
    ("random-allocation", ["allocation.method=uniform-shuffle"]),
]


def _float(v: str | None) -> float | None:
    return float(v) if v not in (None, "") else None


def run_summary(label: str, run_dir: Path) -> dict[str, Any]:
    """One variant's numbers, from its result rows, schedule marker and train.json."""
    rows = read_rows(run_dir / PART_NAME)
    first = rows[0]
    loss = next((r for r in rows if (r["benchmark"], r["metric"]) == ("heldout", "loss")), None)
    sched = read_json(stage_marker(run_dir, "schedule"))
    train = read_json(run_dir / "train.json")
    return {
        "variant": label,
        "run_dir": str(run_dir),
        "n_selected": int(first["n_selected"]),
        "kept_fraction": _float(first["kept_fraction"]),
        "tokens_trained": train.get("tokens"),
        "steps": sched["derived"]["total_steps"],
        "predicted_idle_share": _float(first.get("predicted_idle_share")),
        "allreduce_wait_share": _float(first.get("allreduce_wait_share")),
        "train_s": _float(first["train_s"]),
        "heldout_loss": _float(loss["value"]) if loss else None,
        "status": first["status"],
    }


def bench_balance(
    config: str, ratio: float, output_dir: Path, overrides: list[str], force: bool = False
) -> list[dict[str, Any]]:
    from repro.pipeline import run_experiment
    from slurm.jobs import link_shared

    common = [
        f"output_dir={output_dir}",
        "selection.method=cluster",
        f"selection.params.ratio={ratio:g}",
        "allocation.method=cluster-interleave",
        "allocation.weight_mode=rank",
        *overrides,
    ]
    out: list[dict[str, Any]] = []
    first: Path | None = None
    for label, extra in VARIANTS:
        cfg = load_config(config, common + [f"name=bench-balance-{label}", *extra])
        if first is not None and not force:
            link_shared(first, cfg.run_dir())  # the same pool and features: computed once
        run_dir = run_experiment(cfg, force=force)
        first = first or run_dir
        out.append(run_summary(label, run_dir))
    base = out[0]["train_s"]
    for r in out:
        r["train_vs_cluster"] = r["train_s"] / base if base and r["train_s"] else None
    atomic_write_json(
        output_dir / "bench_balance.json",
        {
            "config": config,
            "ratio": ratio,
            "overrides": overrides,
            "provenance": provenance(),  # commit, package versions, hardware, time
            "runs": out,
        },
    )
    atomic_write_text(output_dir / "bench_balance.md", format_balance(out) + "\n")
    return out


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def format_balance(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (reports/render.py computed_table); "—" where a value is missing."""
    from reports.render import computed_table

    cols: list[tuple[str, Any]] = [
        ("variant", lambda r: f"{r['variant']}"),
        ("kept", lambda r: f"{r['n_selected']}"),
        ("tokens trained", lambda r: f"{r['tokens_trained']}"),
        ("steps", lambda r: f"{r['steps']}"),
        ("predicted idle (%)", lambda r: _pct(r["predicted_idle_share"])),
        ("all-reduce wait (%)", lambda r: _pct(r["allreduce_wait_share"])),
        ("train s", lambda r: f"{r['train_s']:.1f}"),
        ("x CluSTER", lambda r: f"{r['train_vs_cluster']:.2f}" if r["train_vs_cluster"] else "—"),
        ("held-out loss", lambda r: f"{r['heldout_loss']:.4f}" if r["heldout_loss"] is not None else "—"),
    ]
    return computed_table(cols, rows)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster-repro bench balance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/demo.yaml", help="the base config")
    p.add_argument(
        "--ratio", type=percent, default=50, help="CluSTER's ratio in percent (50: the paper's r = 0.5)"
    )
    p.add_argument("--out", default="runs/bench-balance", help="where the runs and bench_balance.json go")
    p.add_argument("--force", action="store_true", help="redo every run from the start")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value")


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(a: argparse.Namespace) -> int:
    try:
        rows = bench_balance(a.config, a.ratio, Path(a.out), a.overrides, a.force)
    except (ConfigError, SelectionError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunStopped as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(format_balance(rows))
    print(f"\n{Path(a.out) / 'bench_balance.json'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
