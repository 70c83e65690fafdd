"""The board written out: one self-contained HTML page (inline CSS, the figure inside as a
base64 PNG, no script, nothing fetched), and the same table as Markdown, CSV and LaTeX
(reports/render.py, as every report table).

    <out>/board.html  board.md  board.csv  board.tex  pareto.png  pareto.pdf
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from reports.board.board import Board, Entry
from reports.board.figure import pareto_figure
from reports.render import LEGEND, fmt, to_csv, to_latex, to_markdown
from reports.stats import Estimate
from reports.values import Column, Table
from repro.core.io import atomic_write_text
from repro.core.tracks import BASELINES, FULL


def _metric_kind(metric: str) -> str:
    return "num" if metric in ("loss", "perplexity") else "pct"


def board_table(board: Board) -> Table:
    """The board as a report Table: one row per budget and method."""
    t = board.track
    m = t.metrics.primary
    kind = _metric_kind(m.metric)
    cols = [
        Column("budget"),
        Column("rank", "text"),
        Column("method"),
        Column("seeds", "int"),
        Column(m.name, kind, best="max" if m.higher_is_better else "min"),
        *[Column(s.name, _metric_kind(s.metric)) for s in t.metrics.secondary],
        Column("vs_random_count", kind, label="Δ random, equal count (+ better)"),
        Column("vs_random_compute", kind, label="Δ random, equal compute (+ better)"),
        Column("kept", "num0", label="kept"),
        Column("selection_device_s", "sec", label="selection (device-s)"),
        Column("selection_share", "pct", label="selection / training (%)"),
        Column("total_device_s", "sec", label="total (device-s)"),
        Column("end_to_end_s", "sec", label="end to end (s)"),
        Column("predicted_idle", "pct", label="predicted idle (%)"),
        Column("tied_with", label="tied with"),
    ]
    rows = []
    rankable = []
    for e in board.entries:
        rank = "ref" if e.role == FULL else ("—" if e.rank is None else str(e.rank))
        q = "diverged" if e.diverged and e.quality is None else e.quality
        rows.append(
            [
                e.budget,
                rank,
                e.label,
                len(e.runs),
                q,
                *e.secondary,
                e.vs_count,
                e.vs_compute,
                e.kept,
                e.selection_device_s,
                e.selection_share,
                e.total_device_s,
                e.end_to_end_s,
                e.idle,
                ", ".join(e.ties),
            ]
        )
        rankable.append(e.role != FULL)
    notes = [
        f"track {t.track} v{t.version} ({t.digest()}): {t.about}",
        f"protocol: {t.protocol}",
        "baselines every track runs: " + "; ".join(BASELINES),
        "rank: 1 + the methods significantly better (paired t-test over shared seeds, Holm-adjusted "
        "within the budget, 5%); methods no test tells apart share a rank",
        *board.notes,
        *[f"{e.label} @ {e.budget}: {n}" for e in board.entries for n in e.notes],
    ]
    return Table(
        "board",
        f"Track {t.track} (v{t.version}): {m.name} by budget",
        cols,
        rows,
        notes=notes,
        caption="Bold: the best mean of its budget.",
        group_by=("budget",),
        rankable=rankable,
    )


_CSS = """
body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}
table.board{border-collapse:collapse;font-size:0.85em}
table.board th,table.board td{border-bottom:1px solid #ddd;padding:0.3em 0.6em;text-align:right}
table.board th{background:#f3f3f3;vertical-align:bottom}
table.board td.text,table.board th.text{text-align:left}
table.board tr.budget td{background:#fafafa;font-weight:bold;text-align:left}
table.board tr.reference td{color:#666}
table.board td.num{white-space:nowrap}
table.board span.ci{display:block;font-size:0.8em;color:#666}
td.best span.mean{font-weight:bold}
figure{margin:1.5em 0}figure img{width:100%;max-width:60em;height:auto}
.notes li{font-size:0.85em;margin:0.2em 0}
"""


def _cell(v: object, col: Column) -> str:
    """A cell's text: the mean, and its interval below it in smaller type."""
    text = fmt(v, col)
    head, sep, tail = text.partition(" [")
    if not sep:
        return f'<span class="mean">{html.escape(text)}</span>'
    return f'<span class="mean">{html.escape(head)}</span><span class="ci">[{html.escape(tail)}</span>'


def to_html(board: Board, table: Table, png: bytes) -> str:
    """The self-contained page: the table, the figure (base64 PNG), the notes and sources."""
    t = board.track
    cols = [c for c in table.columns if c.name != "budget"]
    idx = {c.name: i for i, c in enumerate(table.columns)}
    best = {}
    m = t.metrics.primary
    for b in t.names():
        vals = [
            e.quality.value
            for e in board.budget_entries(b)
            if e.role != FULL and isinstance(e.quality, Estimate)
        ]
        if vals:
            best[b] = max(vals) if m.higher_is_better else min(vals)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Track {html.escape(t.track)} board</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Track {html.escape(t.track)} (version {t.version}): {html.escape(m.name)}</h1>",
        f"<p>{html.escape(t.about)}. {html.escape(t.protocol)}.</p>",
        '<table class="board"><thead><tr>',
        *[f'<th class="{"text" if c.kind == "text" else "num"}">{html.escape(c.shown)}</th>' for c in cols],
        "</tr></thead><tbody>",
    ]
    budget = None
    for row, e in zip(table.rows, board.entries):
        if e.budget != budget:
            budget = e.budget
            out.append(f'<tr class="budget"><td colspan="{len(cols)}">budget {html.escape(budget)}</td></tr>')
        cls = "reference" if e.role == FULL else "method"
        out.append(
            f'<tr class="{cls}" data-budget="{html.escape(e.budget)}" data-method="{html.escape(e.label)}">'
        )
        for c in cols:
            v = row[idx[c.name]]
            klass = "text" if c.kind == "text" else "num"
            if (
                c.name == m.name
                and isinstance(v, Estimate)
                and best.get(e.budget) == v.value
                and e.role != FULL
            ):
                klass += " best"
            out.append(f'<td class="{klass}">{_cell(v, c)}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    b64 = base64.b64encode(png).decode("ascii")
    out += [
        f'<figure><img id="pareto" alt="quality against total cost" src="data:image/png;base64,{b64}">',
        f"<figcaption>{html.escape(m.name)} against total cost (selection + training, device-seconds); "
        "error bars: 95% Student-t intervals over seeds; the line joins the Pareto front.</figcaption>",
        "</figure>",
        '<h2>Notes</h2><ul class="notes">',
        f"<li>{html.escape(LEGEND)}</li>",
        *[f"<li>{html.escape(n)}</li>" for n in table.notes],
        "</ul>",
        '<h2>Sources</h2><ul class="notes">',
        *[f"<li>{html.escape(s)}</li>" for s in board.sources],
        "</ul></body></html>",
    ]
    return "\n".join(out) + "\n"


def write_board(board: Board, out: Path) -> dict[str, Path]:
    """Write the board's files under `out`; returns them by kind."""
    out.mkdir(parents=True, exist_ok=True)
    table = board_table(board)
    png, pdf = pareto_figure(board, out)
    files = {"png": png, "pdf": pdf}
    for kind, text in (
        ("md", to_markdown(table, level=1)),
        ("csv", to_csv(table)),
        ("tex", to_latex(table)),
        ("html", to_html(board, table, png.read_bytes())),
    ):
        path = out / f"board.{kind}"
        atomic_write_text(path, text)
        files[kind] = path
    return files


def entry_summary(e: Entry) -> str:
    """One line of the board for the terminal."""
    q = "—" if e.quality is None else fmt(e.quality, Column("q", "num"))
    return f"{e.budget:>8}  {('ref' if e.role == FULL else e.rank) or '—'!s:>3}  {e.label:40s} {q}"
