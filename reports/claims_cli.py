"""`cluster-repro claims`: the paper's claims checked against the results store.

Registered into repro/cli.py's parser through `register(subparsers, epilog)`. Writes into OUT:
claims.md (the verdict table, the commands of what was not run, the training time taken apart),
tables/claims.{md,tex,csv} and tables/claims_time.{md,tex,csv}, claims.json (the verdicts as
data) and figures/claims.{png,pdf}; prints claims.md. docs/claims.md says how verdicts are made.
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
        description="For every claim of reports/claims.yaml (C1-C6 and the 8-GPU statement) and "
        "every setting of the results that holds its cells: the 95%% bootstrap interval of the "
        "difference (over seeds, and items where both runs have per-item scores) against the "
        "claim's threshold gives consistent / not reproduced / inconclusive; a claim whose cells "
        "are missing is 'not run', with the run-list snippet and command that run them. Each "
        "verdict names its run ids, scale, protocol, and whether it is a CPU-scale verdict. Also "
        "the training time taken apart (token share, straggler idle, selection share, end to end, "
        "token balancing). See docs/claims.md.",
        epilog="Example: cluster-repro claims --results runs --out runs/claims",
    )
    p.add_argument("--results", default="runs", help="the output_dir the runs wrote to, or one results CSV")
    p.add_argument("--out", default=None, help="where to write (default: RESULTS/claims, or next to the CSV)")
    p.add_argument(
        "--claims-file", default=None, help="a claims file of your own (default: reports/claims.yaml)"
    )
    p.add_argument("--no-figure", action="store_true", help="skip the figure")
    p.set_defaults(func=run_claims)


def load_rep(results: Path, run_ids: set[str] | None = None):  # noqa: ANN201 (reports.tables.Report)
    """The Report (cells) of a results folder or CSV, every file checked as the report reads it."""
    from reports.load import ReportInputError, build_runs, find_result_files, group_cells, read_results
    from reports.tables import Report

    files, root = find_result_files(Path(results))
    rows, _ = read_results(files, root)
    if run_ids is not None:
        rows = [(w, r) for w, r in rows if r["run_id"] in run_ids]
        if not rows:
            raise ReportInputError(f"none of the runs {sorted(run_ids)} has rows in {results}")
    return Report(group_cells(build_runs(rows, root)))


def claims_markdown(tables: list, verdicts: list) -> str:
    from reports.claims_output import snippets_md, verdict_counts
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
) -> tuple[Path, str]:
    """Write the claims check of `results` into `out`; returns (claims.md, its text)."""
    from reports.claims import CLAIMS_FILE, load_claims
    from reports.claims_figure import claims_figure
    from reports.claims_output import verdicts_json
    from reports.claims_time import claims_tables
    from reports.render import to_csv, to_latex, to_markdown
    from repro.core.io import atomic_write_text

    load_claims(Path(claims_file or CLAIMS_FILE))  # a malformed file stops before any work
    rep = load_rep(results, run_ids)
    results = Path(results)
    hint = str(results.parent if results.is_file() else results)  # the output_dir of the runs
    tables, verdicts = claims_tables(rep, hint, Path(claims_file or CLAIMS_FILE))
    out = Path(out)
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
    return out / "claims.md", text


def run_claims(args: argparse.Namespace) -> int:
    from reports.load import ReportInputError

    results = Path(args.results)
    out = Path(args.out) if args.out else (results.parent if results.is_file() else results) / "claims"
    try:
        path, text = write_claims(results, out, args.claims_file, figure=not args.no_figure)
    except (ReportInputError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"\nWritten: {path} (tables/, figures/, claims.json beside it)")
    return 0
