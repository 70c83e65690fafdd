"""`cluster-repro bench calibration`: how often the claims' verdicts are wrong on simulated stores
with known effects, beside the rule they replaced (the simulation: reports/calibration.py; the
table and why: docs/claims.md, "Calibration")."""

from __future__ import annotations

import argparse

from repro.core.argtypes import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reps", type=positive_int, default=2000, help="simulated stores a row (default 2000)")
    p.add_argument("--old-reps", type=positive_int, default=2000, help="for the old rule (default 2000)")
    p.add_argument(
        "--old-item-reps", type=positive_int, default=500, help="the old rule with items (default 500)"
    )
    p.add_argument("--out", default=None, help="also write the table (Markdown) to this file")


def run(args: argparse.Namespace) -> int:
    from reports.calibration import table

    text = table(args.reps, args.old_reps, args.old_item_reps)
    print(text)
    if args.out:
        from repro.core.io import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster-repro bench calibration",
        description="How often the claims' verdicts are wrong on simulated stores with known effects "
        "(reports/calibration.py), beside the rule they replaced.",
    )
    add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
