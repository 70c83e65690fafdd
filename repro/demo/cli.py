"""`cluster-repro demo`: the demo's own command, registered as a package's commands are
(repro/commands/__init__.py)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, epilog: str) -> None:
    p = sub.add_parser(
        "demo",
        help="run the CPU mini-reproduction on the generated demo pool",
        description="Fine-tune SmolLM2-135M-Instruct (LoRA) with 4 gloo DDP workers "
        "on the generated demo pool, once per method, and print the results table. "
        "docs/measurements.md gives its time on 2 cores; --quick uses a tiny random "
        "model instead.",
        epilog=epilog,
    )
    p.add_argument("--quick", action="store_true", help="tiny random model, small pool (for tests)")
    p.add_argument("--force", action="store_true", help="redo every stage even if its output exists")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key.sub=value",
        help="override demo config keys, e.g. output_dir=/tmp/demo",
    )
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from repro.demo.run import demo_claims, run_demo, summary_table, write_demo_report

    run_dirs, merged = run_demo(quick=args.quick, overrides=args.overrides, force=args.force)
    print(summary_table(run_dirs))
    print(f"\nResults: {merged} (one row per run, benchmark and metric); run folders:")
    for d in run_dirs:
        print(f"  {d}")
    # The report: tables and figures (reports/)
    print(f"\nReport (tables, figures, index page): {write_demo_report(run_dirs, merged)}")
    # last: the paper's claims on these runs
    print("\n" + demo_claims(run_dirs, merged))
    return 0
