"""`cluster-repro claims`: the paper's claims checked against the results store.

Registered into repro/cli.py's parser through `register(subparsers, epilog)`. Writes into OUT:
claims.md (the verdict table, the commands of what was not run, the training time taken apart),
tables/claims.{md,tex,csv} and tables/claims_time.{md,tex,csv}, claims.json (the verdicts as
data) and figures/claims.{png,pdf}; prints claims.md. OUT is written as one set, as the report
is (reports/build.py: a staging folder swapped in whole), so a killed check never leaves an old
claims.md beside new tables. docs/claims.md says how verdicts are made.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction, epilog: str) -> None:  # noqa: ARG001 (own epilog)
    p = sub.add_parser(
        "claims",
        help="check each of the paper's claims against the results: consistent, not reproduced, "
        "inconclusive or not run",
        description="For every claim of reports/claims/claims.yaml (C1-C6 and the 8-GPU statement) and "
        "every setting of the results that holds its cells: the 95%% Student-t interval of the "
        "difference over seeds (one seed: over its items, no firm verdict) against the "
        "claim's threshold gives consistent / not reproduced / inconclusive; a claim whose cells "
        "are missing is 'not run', with the experiment-file snippet and command that run them. Each "
        "verdict names its run ids, scale, protocol, and whether it is a CPU-scale verdict. Also "
        "the training time taken apart (token share, straggler idle, selection share, end to end, "
        "token balancing). See docs/claims.md.",
        epilog="Example: cluster-repro claims --results runs --out runs/claims",
    )
    p.add_argument("--results", default="runs", help="the output_dir the runs wrote to, or one results CSV")
    p.add_argument("--out", default=None, help="where to write (default: RESULTS/claims, or next to the CSV)")
    p.add_argument(
        "--claims-file", default=None, help="a claims file of your own (default: reports/claims/claims.yaml)"
    )
    p.add_argument("--no-figure", action="store_true", help="skip the figure")
    p.add_argument(
        "--allow-damaged",
        action="store_true",
        help="leave out results files that are damaged (cut, or not matching their checksum) "
        "instead of stopping; each is named on stderr",
    )
    p.set_defaults(func=run_claims)


def load_rep(results: Path, run_ids: set[str] | None = None, allow_damaged: bool = False):  # noqa: ANN201
    """The Report (cells) of a results folder or merged CSV, every file checked as the report
    reads it (reports/load.py)."""
    from reports.load import group_cells, load
    from reports.values import Report

    loaded = load(Path(results), allow_damaged, run_ids)
    for note in loaded.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    return Report(group_cells(loaded.runs))


def claims_markdown(tables: list, verdicts: list) -> str:
    from reports.claims.output import snippets_md, verdict_counts
    from reports.render import to_markdown

    counts = ", ".join(f"{n} {k}" for k, n in verdict_counts(verdicts).items())
    out = [
        "# The paper's claims against these results",
        "",
        f"Verdicts: {counts}.",
        "",
        to_markdown(tables[0]),
    ]
    snip = snippets_md(verdicts)
    if snip:
        out += ["## What was not run, and the commands that run it", ""] + snip
    out += [to_markdown(tables[1])]
    return "\n".join(out)


def write_claims(
    results: Path,
    out: Path,
    claims_file: Path | None = None,
    figure: bool = True,
    run_ids: set[str] | None = None,
    allow_damaged: bool = False,
) -> tuple[Path, str]:
    """Write the claims check of `results` into `out`, as one set (staged, then swapped in);
    returns (claims.md, its text)."""
    from reports.build import REPORT_MARK, _staging, check_report_out, publish_report
    from reports.claims.figure import claims_figure
    from reports.claims.file import CLAIMS_FILE, load_claims
    from reports.claims.output import verdicts_json
    from reports.claims.time import claims_tables
    from reports.render import to_csv, to_latex, to_markdown
    from repro.core.io import atomic_write_text

    final = Path(out)
    check_report_out(final)  # a file, or a folder that is none of ours, is refused before any work
    load_claims(Path(claims_file or CLAIMS_FILE))  # a malformed file stops before any work
    rep = load_rep(results, run_ids, allow_damaged)
    results = Path(results)
    hint = str(results.parent if results.is_file() else results)  # the output_dir of the runs
    tables, verdicts = claims_tables(rep, hint, Path(claims_file or CLAIMS_FILE))
    out = _staging(final)
    for t in tables:
        atomic_write_text(out / "tables" / f"{t.name}.md", to_markdown(t))
        atomic_write_text(out / "tables" / f"{t.name}.tex", to_latex(t))
        atomic_write_text(out / "tables" / f"{t.name}.csv", to_csv(t))
    atomic_write_text(out / "claims.json", verdicts_json(verdicts))
    if figure:
        claims_figure(verdicts, out / "figures")
    text = claims_markdown(tables, verdicts)
    if figure:
        text += "\n![claims](figures/claims.png)\n"
    atomic_write_text(out / "claims.md", text)
    atomic_write_text(out / REPORT_MARK, "a claims folder written by `cluster-repro claims`\n")
    publish_report(out, final)
    return final / "claims.md", text


def run_claims(args: argparse.Namespace) -> int:
    from reports.runs import ReportInputError

    results = Path(args.results)
    out = Path(args.out) if args.out else (results.parent if results.is_file() else results) / "claims"
    try:
        path, text = write_claims(
            results, out, args.claims_file, figure=not args.no_figure, allow_damaged=args.allow_damaged
        )
    except (ReportInputError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"\nWritten: {path} (tables/, figures/, claims.json beside it)")
    return 0
