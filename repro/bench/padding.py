"""`cluster-repro bench padding`: how many padded positions a run's schedule makes the devices
compute, and what length-grouped micro-batches (`train.length_grouped`) would save.

    cluster-repro bench padding CONFIG [--out runs/bench-padding] [key.sub=value ...]

No training and no timing: the config's pipeline up to its schedule (model, pool, selection,
schedule stages, in --out; finished stages are skipped), then for every shape of the
optimizer step with the config's per-worker examples per step P (per-device batch b x
accumulation P / b, for every b dividing P) the padded tokens (each micro-batch's rows x its
longest row, repro/core/steps.py) in the schedule's order and length-grouped, beside the real
tokens, and the sum over steps of the busiest worker's padded tokens (what the time model takes
a run's time as proportional to). The counts are the same on any machine. Writes
bench_padding.json and bench_padding.md to --out and prints the table.

What it saves in time is a training question: run the config twice, with
`train.length_grouped=false` and `=true` (docs/stragglers.md gives the commands), and compare
train_s.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reports.render import markdown_grid
from repro.core.config.load import load_config
from repro.core.io import atomic_write_json, atomic_write_text


def shapes(per_step: int) -> list[tuple[int, int]]:
    """(per-device batch, accumulation) with b x accum = per_step, the largest batch first."""
    return [(b, per_step // b) for b in range(per_step, 0, -1) if per_step % b == 0]


def padding_rows(run_dir: Path, max_length: int) -> list[dict[str, Any]]:
    """Per step shape: real and padded tokens, plain and length-grouped, of the run's schedule."""
    from repro.core import steps
    from repro.core.io import read_json, read_jsonl
    from repro.core.rundir import model_dir_of
    from repro.core.types import Example, Schedule, read_selection

    sched = Schedule.from_dict(read_json(run_dir / "schedule.json"))
    derived = read_json(run_dir / "derived.json")
    ids = set(dict.fromkeys(read_selection(run_dir / "selection.json").ids))
    examples = [Example.from_dict(r) for r in read_jsonl(run_dir / "pool.jsonl") if r["id"] in ids]
    lengths = steps.token_lengths(examples, model_dir_of(run_dir), max_length)
    per_step = derived["per_worker_batch"] * derived["grad_accum"]
    args = (sched, lengths, per_step, derived["steps_per_epoch"], derived["total_steps"])
    rows = []
    for b, accum in shapes(per_step):
        plain = steps.straggler_summary(*args, accum=accum, grouped=False)
        grouped = steps.straggler_summary(*args, accum=accum, grouped=True)
        rows.append(
            {
                "per_device_batch": b,
                "accum": accum,
                "config_shape": (b, accum) == (derived["per_worker_batch"], derived["grad_accum"]),
                "steps": derived["total_steps"],
                "tokens": plain["tokens"],
                "padded_tokens": plain["padded_tokens"],
                "padded_tokens_grouped": grouped["padded_tokens"],
                "busiest_padded_tokens": plain["busiest_padded_tokens"],
                "busiest_padded_tokens_grouped": grouped["busiest_padded_tokens"],
                "predicted_idle_share": plain["predicted_idle_share"],
                "predicted_idle_share_grouped": grouped["predicted_idle_share"],
            }
        )
    return rows


def format_rows(rows: list[dict[str, Any]], title: str) -> str:
    def pct(x: float | None) -> str:
        return "—" if x is None else f"{100 * x:.1f}"

    head = [
        "per-device batch x accum",
        "real tokens",
        "padded",
        "padded / real",
        "padded, grouped",
        "saved by grouping (%)",
        "busiest worker's padded (sum over steps)",
        "the same, grouped",
        "predicted time saved by grouping (%)",
        "predicted idle (%): plain / grouped",
    ]
    body = []
    for r in rows:
        shape = f"{r['per_device_batch']} x {r['accum']}" + (" (the config's)" if r["config_shape"] else "")
        body.append(
            [
                shape,
                f"{r['tokens']:,}",
                f"{r['padded_tokens']:,}",
                f"{r['padded_tokens'] / r['tokens']:.3f}",
                f"{r['padded_tokens_grouped']:,}",
                pct(1 - r["padded_tokens_grouped"] / r["padded_tokens"]),
                f"{r['busiest_padded_tokens']:,}",
                f"{r['busiest_padded_tokens_grouped']:,}",
                pct(1 - r["busiest_padded_tokens_grouped"] / r["busiest_padded_tokens"]),
                f"{pct(r['predicted_idle_share'])} / {pct(r['predicted_idle_share_grouped'])}",
            ]
        )
    return title + "\n\n" + "\n".join(markdown_grid(head, body)) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="the run's config (its selection and allocation decide the schedule)")
    p.add_argument("--out", default="runs/bench-padding", help="where the run folder and tables go")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cluster-repro bench padding", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    from repro.pipeline import run_experiment

    out = Path(args.out)
    cfg = load_config(args.config, [*args.overrides, f"output_dir={out}"])
    run_dir = run_experiment(cfg, until="schedule")
    rows = padding_rows(run_dir, cfg.data.max_length)
    title = (
        f"Padded tokens of {cfg.name} ({cfg.selection.method}, {cfg.world_size} workers, "
        f"run folder {run_dir}): every step shape of {rows[0]['per_device_batch']} examples per "
        "worker and step"
    )
    text = format_rows(rows, title)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "bench_padding.json", {"run_dir": str(run_dir), "rows": rows})
    atomic_write_text(out / "bench_padding.md", text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_intermixed_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
