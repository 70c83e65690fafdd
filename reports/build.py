"""Build the whole report from the results store: tables (Markdown, LaTeX, CSV), figures (PNG,
PDF) and an index page, deterministically (the same rows give byte-identical files).

    OUT/index.md                 every table inline, links to its .tex/.csv, the figures
    OUT/tables/<name>.{md,tex,csv}
    OUT/figures/<name>.{png,pdf}

The claims (reports/claims/verdicts.py: each of the paper's claims against these runs, and the training
time taken apart) follow the compact tables, under "Claims", with their figure.
The analyses (reports/analyses.py: overlap, score ranks, coverage, seed variance, selection cost)
come last on the index page, under "Analyses", their figures only where they have inputs.

Warnings (also printed on the index page): result rows from more than one lm-eval version (scores
drift between versions, so one table should not mix them), and from more than one git commit.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from reports.analyses import analysis_tables
from reports.claims.figure import claims_figure
from reports.claims.output import snippets_md, verdict_counts
from reports.claims.time import claims_tables
from reports.compact import compact_tables
from reports.figures.analysis import ANALYSIS_FIGURES, analysis_figures
from reports.figures.loss import NAME as LOSS_FIGURE
from reports.figures.loss import heldout_loss_figure
from reports.figures.main import all_figures
from reports.figures.style import FIGURES
from reports.load import group_cells, input_digest, load
from reports.render import to_csv, to_latex, to_markdown
from reports.reported import load_reported, protocol_gap_table, reported_table
from reports.runs import split_protocol
from reports.tables import (
    ABLATIONS,
    ablation_table,
    balance_table,
    differences_table,
    drop_blank_columns,
    main_table,
    overhead_table,
    runs_table,
)
from reports.values import Report, Table
from repro.core.io import atomic_write_text


class MixedVersionsWarning(UserWarning):
    """Rows in one table come from different lm-eval versions (their scores may not compare)."""


def version_warnings(runs: list) -> list[str]:
    """Messages for mixed lm-eval versions (warned) and mixed commits (noted)."""
    out = []
    lm = sorted({r.lm_eval or "not installed" for r in runs})
    if len(lm) > 1:
        which = {v: sorted(r.run_id for r in runs if (r.lm_eval or "not installed") == v) for v in lm}
        msg = (
            "result rows come from different lm-eval versions: "
            + "; ".join(f"{v}: {len(ids)} run(s), e.g. {ids[0]}" for v, ids in which.items())
            + ". Scores can drift between harness versions; rerun the evaluation with one "
            "version before comparing them in one table."
        )
        warnings.warn(msg, MixedVersionsWarning, stacklevel=3)
        out.append(msg)
    shas = sorted({r.git_sha for r in runs} - {""})
    if len(shas) > 1:
        out.append(f"runs come from {len(shas)} different commits of this project")
    return out


# Tables in cell order, whose LaTeX prints each setting as a block heading (not a column).
BY_SETTING = ("main", "differences", "overhead", "balance")


def all_tables(rep: Report, reported: list[dict[str, Any]]) -> list[Table]:
    """Every table, in the order of the index page: the compact main tables (one per domain)
    first. Assembled here, not in tables.py, so that no module of reports/ imports one that
    imports it back (tables <- reported <- compact <- build)."""
    tables = compact_tables(rep, reported)
    tables += [main_table(rep), differences_table(rep), overhead_table(rep)]
    tables += [ablation_table(rep, *a) for a in ABLATIONS]
    tables += [balance_table(rep), reported_table(rep, reported)]
    tables += [runs_table([r for c in rep.cells for r in c.runs])]
    if any(split_protocol(b)[1] != "lm-eval" for b, _ in rep.quality):
        tables.append(protocol_gap_table(rep))
    for t in tables:
        if t.name in BY_SETTING:
            t.group_by = ("setting",)
    return [drop_blank_columns(t) for t in tables]


def _table_section(t: Table) -> list[str]:
    return [
        to_markdown(t),
        f"Files: [{t.name}.md](tables/{t.name}.md) · "
        f"[{t.name}.tex](tables/{t.name}.tex) · [{t.name}.csv](tables/{t.name}.csv)",
        "",
    ]


def build_report(
    results: Path,
    out: Path,
    figures: bool = True,
    run_ids: set[str] | None = None,
    allow_damaged: bool = False,
) -> Path:
    """Write the report for the results at `results` (a folder or a merged CSV) into `out`;
    returns the index page. figures=False skips the figures (and their links); run_ids keeps only
    those runs (the demo reports its own runs); allow_damaged leaves damaged results files out
    (named on the index page) instead of stopping."""
    final = Path(out)
    check_report_out(final)  # before any work: a file, or a folder that is not a report, is refused
    loaded = load(Path(results), allow_damaged, run_ids)
    damaged = [n for n in loaded.notes if n.startswith("skipped damaged")]
    schema_info = [n for n in loaded.notes if not n.startswith("skipped damaged")]
    for note in damaged:  # on the index page too; said here so a script's log shows it
        print(f"warning: {note}", file=sys.stderr, flush=True)
    runs = loaded.runs
    files, root = loaded.store.files, loaded.store.root
    cells = group_cells(runs)
    rep = Report(cells)
    notes = damaged + version_warnings(runs)
    tables = all_tables(rep, load_reported())
    claims, verdicts = claims_tables(rep, str(root))  # the paper's claims against these runs
    tables += claims
    analyses, kept = analysis_tables(rep)
    tables += analyses
    out = _staging(final)  # written whole, then renamed into place (publish_report)
    tdir, fdir = out / "tables", out / "figures"
    data_versions = sorted({(b, v) for r in runs for b, v in r.data_versions.items()})
    for t in tables:
        if notes and (t.name == "main" or t.name.startswith("main_compact_")):
            t.notes = t.notes + [f"WARNING: {n}" for n in notes]
        if data_versions and (t.name == "main" or t.name.startswith("main_compact_")):
            t.notes = t.notes + [
                "Benchmark data versions: " + "; ".join(f"{b} {v}" for b, v in data_versions)
            ]
        atomic_write_text(tdir / f"{t.name}.md", to_markdown(t))
        atomic_write_text(tdir / f"{t.name}.tex", to_latex(t))
        atomic_write_text(tdir / f"{t.name}.csv", to_csv(t))
    drawn: set[str] = set()
    loss_fig: list[Path] = []
    if figures:
        loss_fig = heldout_loss_figure(rep, fdir)  # first, where the runs have held-out loss
        all_figures(rep, fdir, load_reported())  # the paper's points beside ours
        drawn = {p.stem for p in analysis_figures(kept, fdir)}  # those with inputs
        claims_figure(verdicts, fdir)

    n_files = ", ".join(
        sorted({str(f.relative_to(root)) if f.is_relative_to(root) else f.name for f in files})[:3]
    ) + (" ..." if len(files) > 3 else "")
    index = [
        "# CluSTER reproduction report",
        "",
        f"Rebuilt by `cluster-repro report` from {sum(len(r.rows) for r in runs)} result rows of "
        f"{len(runs)} runs ({len(cells)} cells) in {len(files)} file(s): {n_files}. Input digest "
        f"`{input_digest(runs)}` (same digest, same report).",
        "",
    ]
    if notes:
        index += ["**Warnings**", ""] + [f"- {n}" for n in notes] + [""]
    if schema_info:
        index += ["**Notes**", ""] + [f"- {n}" for n in schema_info] + [""]
    compact = {t.name for t in tables if t.name.startswith("main_compact_")}
    for t in tables:  # first: the tables a paper prints
        if t.name in compact:
            index += _table_section(t)
    index += [
        "## Claims",
        "",
        f"Verdicts: {', '.join(f'{n} {k}' for k, n in verdict_counts(verdicts).items())} "
        "(docs/claims.md; `cluster-repro claims` prints the commands of what was not run).",
        "",
    ]
    if figures:
        index += [
            "![claims](figures/claims.png)",
            "",
            "[claims.png](figures/claims.png) · [claims.pdf](figures/claims.pdf)",
            "",
        ]
    for t in claims:
        index += _table_section(t)
    snippets = snippets_md(verdicts)
    if snippets:
        index += ["### What was not run, and the commands that run it", ""] + snippets
    index += ["## Figures", ""] if figures else []
    for name in ([LOSS_FIGURE] if loss_fig else []) + (list(FIGURES) if figures else []):
        index += [
            f"![{name}](figures/{name}.png)",
            "",
            f"[{name}.png](figures/{name}.png) · [{name}.pdf](figures/{name}.pdf)",
            "",
        ]
    names = {t.name for t in analyses} | {t.name for t in claims}
    for t in tables:
        if t.name not in compact and t.name not in names:
            index += _table_section(t)
    index += ["## Analyses", ""]
    for name in ANALYSIS_FIGURES:
        if name in drawn:
            index += [
                f"![{name}](figures/{name}.png)",
                "",
                f"[{name}.png](figures/{name}.png) · [{name}.pdf](figures/{name}.pdf)",
                "",
            ]
    for t in analyses:
        index += _table_section(t)
    atomic_write_text(out / "index.md", "\n".join(index))
    atomic_write_text(out / REPORT_MARK, "a report folder written by `cluster-repro report`\n")
    publish_report(out, final)
    return final / "index.md"


# ----------------------------------------------------------------------------- a whole folder
#
# A report is many files (tables, figures, index.md). It is written into a staging folder beside
# OUT (`.OUT.partial-<pid>`), then swapped in by renames: a kill leaves either the old report or
# the new one whole (or, between the two renames, none), never an old index.md beside new tables.
# Leftover staging folders are removed by the next report. OUT holds `REPORT_MARK`, so that a
# folder that is not a report (the runs folder, a home directory) is never replaced.

REPORT_MARK = ".cluster-repro-report"


def check_report_out(out: Path) -> None:
    """ReportInputError unless `out` is new, empty, or a report folder this suite wrote."""
    from reports.runs import ReportInputError

    if out.is_file() or (out.exists() and not out.is_dir()):
        raise ReportInputError(f"--out {out}: is a file, not a folder; give a folder for the report")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise ReportInputError(f"--out {out}: {parent} is a file, not a folder; give a folder path")
    if out.is_dir() and any(out.iterdir()) and not (out / REPORT_MARK).is_file():
        raise ReportInputError(
            f"--out {out}: the folder exists and is not a report or claims folder (no {REPORT_MARK}); "
            "its folder is replaced whole, so give a new or empty folder"
        )


def _staging(final: Path) -> Path:
    import os
    import shutil

    final.parent.mkdir(parents=True, exist_ok=True)
    for old in final.parent.glob(f".{final.name}.partial-*"):
        shutil.rmtree(old, ignore_errors=True)  # a killed report's staging folder
    for old in final.parent.glob(f".{final.name}.old-*"):
        shutil.rmtree(old, ignore_errors=True)
    staging = final.parent / f".{final.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def publish_report(staging: Path, final: Path) -> None:
    """Swap the finished staging folder in for `final` (the old report is removed after)."""
    import os
    import shutil

    old = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)
