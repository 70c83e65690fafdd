"""Write a Table as Markdown, LaTeX and CSV, byte for byte the same for the same table.

Markdown and LaTeX show rounded numbers, `mean [low, high]` where there is an interval, a dagger
on single-seed (or single-pair) values, "—" / "--" for missing cells. CSV keeps the numbers
unrounded (10 significant digits), one extra column each for the interval's ends and the seed or
pair count, an empty field for a missing cell and "n/a" for a benchmark the setting does not run.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from reports.stats import Estimate
from reports.values import Column, Table

DIGITS = {
    "pct": 1,
    "num": 3,
    "num0": 0,
    "num2": 2,
    "delta2": 2,
    "sec": 1,
    "min": 1,
    "hours": 2,
    "mb": 0,
    "delta": 1,
    "joules": 0,
}
MISSING_MD, MISSING_TEX = "—", "--"
LEGEND = (
    "— missing (no result, or the benchmark could not be run); blank: not evaluated in this "
    "setting; diverged: training stopped on a non-finite loss or gradient norm (no "
    "scores); mixed eval settings: the seeds' scores were made with different eval settings "
    "(limit, items, shots), so no mean is shown; † single seed (no interval); [low, high]: 95% "
    "Student-t interval over seeds."
)


def _num(v: float, kind: str) -> str:
    if kind == "sig":  # three significant digits, for quantities of any size (variances, hours)
        return f"{v:.3g}"
    d = DIGITS.get(kind, 3)
    if kind == "sec":  # seconds: 3 significant-ish digits below 10 s, 1 decimal above
        d = 1 if abs(v) >= 10 else 2 if abs(v) >= 1 else 3
    s = f"{v:+,.{d}f}" if kind.startswith("delta") else f"{v:,.{d}f}"
    return "-0.0" if s == "-0.0" else s


def fmt(v: Any, col: Column, missing: str = MISSING_MD, dagger: str = "†") -> str:
    if v is None:
        return missing
    if isinstance(v, Estimate):
        s = _num(v.value, col.kind)
        if v.lo is not None and v.hi is not None:
            return f"{s} [{_num(v.lo, col.kind)}, {_num(v.hi, col.kind)}]"
        return s + dagger
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if isinstance(v, int) and col.kind in ("int", "text"):
        return str(v)
    if isinstance(v, (int, float)):
        return _num(float(v), col.kind)
    return str(v)


def _shown_value(v: Any, col: Column) -> float | None:
    """The number a reader sees in a cell (rounded as printed), for choosing the best."""
    x = v.value if isinstance(v, Estimate) else v
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(_num(float(x), col.kind).replace(",", ""))


def best_cells(t: Table) -> set[tuple[int, int]]:
    """(row, column) of the best value of each `best` column within each block (the rows that
    agree on the first group_by column, e.g. one setting), among the rankable rows; ties all
    count. A block with fewer than two values has no best."""
    names = [c.name for c in t.columns]
    group = [names.index(g) for g in t.group_by]
    out: set[tuple[int, int]] = set()
    for j, col in enumerate(t.columns):
        if col.best not in ("max", "min"):
            continue
        blocks: dict[tuple, list[tuple[int, float]]] = {}
        for i, row in enumerate(t.rows):
            x = _shown_value(row[j], col)
            if x is not None and (t.rankable is None or t.rankable[i]):
                blocks.setdefault(tuple(row[g] for g in group[:1]), []).append((i, x))
        for vals in blocks.values():
            if len(vals) < 2:
                continue
            top = (max if col.best == "max" else min)(x for _, x in vals)
            out |= {(i, j) for i, x in vals if x == top}
    return out


def _visible(t: Table) -> list[int]:
    return [j for j, c in enumerate(t.columns) if not c.csv_only]


def markdown_grid(headers: list[str], rows: list[list[str]], numeric: list[bool] | None = None) -> list[str]:
    """The lines of a Markdown table of ready-made cell texts (numeric columns right-aligned)."""
    numeric = numeric or [False] * len(headers)
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def plain_table(cols: list[tuple[str, str, str]], rows: list[dict[str, Any]]) -> str:
    """A benchmark's Markdown table: `cols` are (header, key, format) with a str.format spec;
    a missing or None value is an empty cell (repro/bench/ writes its tables with this)."""
    grid = [[f.format(r[k]) if r.get(k) is not None else "" for _, k, f in cols] for r in rows]
    return "\n".join(markdown_grid([h for h, _, _ in cols], grid))


def computed_table(cols: list[tuple[str, Any]], rows: list[Any]) -> str:
    """A benchmark's Markdown table of computed cells: `cols` are (header, a function of a row
    that gives its cell text)."""
    return "\n".join(markdown_grid([h for h, _ in cols], [[f(r) for _, f in cols] for r in rows]))


def to_markdown(t: Table, level: int = 2) -> str:
    cols = _visible(t)
    bold = best_cells(t)
    out = [f"{'#' * level} {t.title}", ""]
    out.append("| " + " | ".join(t.columns[j].shown for j in cols) + " |")
    out.append("|" + "|".join("---" if t.columns[j].kind == "text" else "---:" for j in cols) + "|")
    for i, row in enumerate(t.rows):
        cells = []
        for j in cols:
            s = fmt(row[j], t.columns[j])
            if (i, j) in bold:  # the mean in bold, the interval after it
                head, sep, tail = s.partition(" [")
                s = f"**{head}**{sep}{tail}"
            cells.append(s.replace("|", "\\|"))
        out.append("| " + " | ".join(cells) + " |")
    if not t.rows:
        out.append("| " + " | ".join("" for _ in cols) + " |")
    if bold:
        out += [
            "",
            f"**Bold**: the best value in its column within each {' / '.join(t.group_by[:1]) or 'table'}.",
        ]
    out += ["", LEGEND] + [f"- {n}" for n in t.notes]
    return "\n".join(out) + "\n"


_TEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "Δ": r"$\Delta$",
    "·": r"$\cdot$",
    "—": "--",
    "†": r"$^\dagger$",
    "±": r"$\pm$",
}
# Tables wider than this many columns are scaled to the text width (graphicx's \resizebox).
TEX_MAX_COLUMNS = 12


def tex_escape(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in s)


def tex_label(t: Table) -> str:
    return "tab:" + t.name.replace("_", "-")


def _tex_num(v: float, kind: str) -> str:
    """A number in LaTeX, with a true minus sign rather than a hyphen."""
    return tex_escape(_num(v, kind)).replace("-", "$-$")


def _tex_cell(v: Any, col: Column, bold: bool) -> str:
    """A cell in LaTeX: the mean (bold when best), its interval smaller, a dagger when single."""
    if isinstance(v, Estimate) and v.lo is not None and v.hi is not None:
        mean = _tex_num(v.value, col.kind)
        mean = rf"\textbf{{{mean}}}" if bold else mean
        return mean + r"\,{\scriptsize[" + _tex_num(v.lo, col.kind) + ", " + _tex_num(v.hi, col.kind) + "]}"
    if isinstance(v, Estimate):
        s = _tex_num(v.value, col.kind) + _TEX["†"]
    elif isinstance(v, (int, float)) and not isinstance(v, bool) and col.kind not in ("int", "text"):
        s = _tex_num(float(v), col.kind)
    else:
        s = tex_escape(fmt(v, col, MISSING_MD))
    return rf"\textbf{{{s}}}" if bold and s else s


def to_latex(t: Table) -> str:
    """A booktabs table environment with caption and label. Columns named in group_by become
    block headings (a midrule and a bold line per outer block, an italic line per inner one)."""
    names = [c.name for c in t.columns]
    group = [names.index(g) for g in t.group_by]
    cols = [j for j in _visible(t) if j not in group]
    bold = best_cells(t)
    wide = len(cols) > TEX_MAX_COLUMNS
    env = "table*" if len(cols) > 5 else "table"
    caption = f"{t.title}. {t.caption} " if t.caption else f"{t.title}. "
    if bold and not t.caption:
        caption += "Bold: the best value in its column. "
    caption += LEGEND
    out = [
        f"% {t.title}. Generated by `cluster-repro report`. Needs \\usepackage{{booktabs}}"
        + (" and \\usepackage{graphicx} (the table is scaled to the text width)." if wide else "."),
        rf"\begin{{{env}}}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{tex_escape(caption)}}}",
        rf"\label{{{tex_label(t)}}}",
    ]
    if wide:
        out.append(r"\resizebox{\textwidth}{!}{%")
    align = "".join("l" if t.columns[j].kind == "text" else "r" for j in cols)
    out += [
        r"\begin{tabular}{" + align + "}",
        r"\toprule",
        " & ".join(tex_escape(t.columns[j].shown) for j in cols) + r" \\",
        r"\midrule",
    ]
    n, prev = len(cols), None
    for i, row in enumerate(t.rows):
        key = tuple(str(row[g]) for g in group)
        for level in range(len(group)):
            if prev is not None and key[: level + 1] == prev[: level + 1]:
                continue
            text = key[level]
            if level == 0:
                if prev is not None:
                    out.append(r"\midrule")
                out.append(rf"\multicolumn{{{n}}}{{l}}{{\textbf{{{tex_escape(text)}}}}} \\")
            else:
                if prev is not None and key[:level] == prev[:level]:
                    out.append(r"\addlinespace")
                text = text[:1].upper() + text[1:]  # "Ours", "Paper (reported)"
                out.append(rf"\multicolumn{{{n}}}{{l}}{{\textit{{{tex_escape(text)}}}}} \\")
        prev = key
        out.append(" & ".join(_tex_cell(row[j], t.columns[j], (i, j) in bold) for j in cols) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}"]
    if wide:
        out.append("}")
    out.append(rf"\end{{{env}}}")
    out += [f"% {n_}" for n_ in t.notes]
    return "\n".join(out) + "\n"


def _csv_num(v: float) -> str:
    return format(float(v), ".10g")


def to_csv(t: Table) -> str:
    stat_cols = {i for i, _ in enumerate(t.columns) if any(isinstance(r[i], Estimate) for r in t.rows)}
    header: list[str] = []
    for i, c in enumerate(t.columns):
        header.append(c.name)
        if i in stat_cols:
            header += [f"{c.name} [low]", f"{c.name} [high]", f"{c.name} [n]"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for row in t.rows:
        out: list[str] = []
        for i, v in enumerate(row):
            if isinstance(v, Estimate):
                out.append(_csv_num(v.value))
            elif v is None:
                out.append("")  # missing
            elif v == "":
                out.append("n/a")  # not evaluated in this setting
            elif isinstance(v, float):
                out.append(_csv_num(v))
            else:
                out.append(str(v))
            if i in stat_cols:
                if isinstance(v, Estimate):
                    out += [
                        "" if v.lo is None else _csv_num(v.lo),
                        "" if v.hi is None else _csv_num(v.hi),
                        str(v.n),
                    ]
                else:
                    out += ["", "", ""]
        w.writerow(out)
    return buf.getvalue()
