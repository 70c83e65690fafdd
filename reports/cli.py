"""`cluster-repro report`: rebuild every table and figure from the results store.

Registered into repro/cli.py's parser through `register(subparsers, epilog)`.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path


def register(sub: argparse._SubParsersAction, epilog: str) -> None:  # noqa: ARG001 (own epilog)
    p = sub.add_parser(
        "report",
        help="rebuild every table and figure from the results (Markdown, LaTeX, CSV, PNG, PDF)",
        description="Rebuild the report from the results store alone: compact main tables "
        "shaped like the paper's (method x benchmark, average, data used, time, the paper's "
        "reported lines beside ours), the detailed main table (data used, "
        "every benchmark, domain averages, train / selection / end-to-end time, reduction vs "
        "full data), paired differences vs full and vs random at the same budget, the selection "
        "overhead, the ablations (weighting, within-cluster choice, allocator x selector, 4 vs 8 "
        "workers), per-worker balance (all-reduce wait per step), and the paper's reported "
        "numbers beside ours; figures at paper column width of quality vs data used, time "
        "breakdown, cluster sizes and worker balance; analyses: kept-set overlap (Jaccard), "
        "selector-score rank correlation (Spearman), category coverage, variance over selection "
        "vs training seeds, selection cost and break-even. The same results give byte-identical "
        "files. See docs/reports.md.",
        epilog="Example: cluster-repro report --results runs --out runs/report (then open "
        "runs/report/index.md).",
    )
    p.add_argument(
        "--results",
        default="runs",
        help="the output_dir the runs wrote to (every run folder under it is read), or one "
        "merged results.csv of `cluster-repro results` (default: runs)",
    )
    p.add_argument(
        "--out", default=None, help="where to write the report (default: RESULTS/report, or next to the CSV)"
    )
    p.add_argument(
        "--allow-damaged",
        action="store_true",
        help="leave out results files that are damaged (cut, or not matching their "
        "checksum) instead of stopping; each is named on the index page",
    )
    p.set_defaults(func=run_report)


def default_out(results: Path) -> Path:
    return (results.parent if results.is_file() else results) / "report"


def run_report(args: argparse.Namespace) -> int:
    from reports.build import MixedVersionsWarning, build_report
    from reports.runs import ReportInputError

    results = Path(args.results)
    out = Path(args.out) if args.out else default_out(results)
    try:
        with warnings.catch_warnings():
            # Shown on the index page and in the main table's notes; say it once here too.
            warnings.simplefilter("ignore", MixedVersionsWarning)
            index = build_report(results, out, allow_damaged=args.allow_damaged)
    except ReportInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = index.read_text(encoding="utf-8")
    if "**Warnings**" in text:
        print("warning: see the Warnings section of the index page", file=sys.stderr)
    print(index)
    return 0
