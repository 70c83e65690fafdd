"""The compact main tables, shaped like the paper's main table: one line per method, one column
per benchmark, then the domain average, data used and training time. One table per domain
(`main_compact_code`, `main_compact_medical`, `main_compact_<name>` for the categories of a
benchmark of held-out rows, such as `main_compact_demo`; `main_compact_other` for settings
scored on no domain's benchmarks), since the domains' benchmarks differ.

Each setting (training set, model, workers) is a block; where the paper reports the same
setting, its numbers follow ours as a block of their own, labelled as the paper's. The detailed
`main` table keeps every column, and the ablations keep their variants: a CluSTER cell with
another allocator, weighting off or a non-default within-cluster choice is left out here.
"""

from __future__ import annotations

from typing import Any

from reports.load import Cell
from reports.names import benchmark_name, cell_method_name, method_name, setting_name
from reports.reported import PROTOCOL_DIFFERS, PaperCell, paper_cells
from reports.runs import RAW_METRICS, norm_benchmark, split_protocol
from reports.stats import Estimate
from reports.tables import quality_column
from reports.values import DIVERGED, MISSING, NOT_EVALUATED, Column, QualityKey, Report, Table

OURS, PAPER = "ours", "paper (reported)"
DOMAIN_TITLES = {"code": "code", "medical": "medical", "other": "other benchmarks"}
# (unit, seconds per unit, render kind), largest first: the first unit our longest run reaches.
TIME_UNITS = (("h", 3600.0, "hours"), ("min", 60.0, "min"), ("s", 1.0, "sec"))


def in_main(c: Cell) -> bool:
    """Whether a cell belongs in the main table: every method as run, but CluSTER only as the
    paper runs it (interleaved allocation, rank weights, default within-cluster choice)."""
    r = c.first
    if r.method != "cluster":
        return True
    extra = {k: v for k, v in r.params.items() if k != "ratio"}
    return (
        r.allocator == "cluster-interleave"
        and r.weight_mode == "rank"
        and extra in ({}, {"prune": "close"})
        and not r.alloc_params
    )


def time_unit(seconds: list[float]) -> tuple[str, float, str]:
    """Hours, minutes or seconds: the largest unit the longest time reaches."""
    top = max(seconds, default=0.0)
    for unit in TIME_UNITS:
        if top >= unit[1]:
            return unit
    return TIME_UNITS[-1]


def paper_order(c: Cell) -> tuple:
    """The order of a paper's table: base model, full data, then each budget from the largest,
    CluSTER first and random at its size next, then the other baselines; methods without a
    ratio budget last."""
    r = c.first
    if r.method in ("base", "full"):
        return (0 if r.method == "base" else 1,)
    ratio = (
        r.ratio if r.ratio is not None else (float(r.budget[2:]) * 100 if r.budget.startswith("r=") else None)
    )
    rank = {"cluster": 0, "random": 1}.get(r.method, 2)
    return (2, 0, -ratio, rank, c.label()) if ratio is not None else (2, 1, 0.0, rank, c.label())


def _setting_key(c: Cell) -> tuple[str, str, int]:
    return (c.first.dataset, c.first.model, c.first.world_size or 0)


def _domain_of_setting(rep: Report, c: Cell) -> list[str]:
    doms = [d for d in rep.domains if rep.domain_keys(c.first, d)]
    return doms or ["other"]


def _keys(rep: Report, cells: list[Cell], domain: str) -> list[QualityKey]:
    """The score columns: the domain's benchmarks, or (other) every score the settings report."""
    if domain != "other":
        want = {k for c in cells for k in rep.domain_keys(c.first, domain)}
    else:
        exp = set().union(*(rep.expected.get((c.first.dataset, c.first.model), set()) for c in cells))
        want = {k for k in rep.quality if k[0] in exp and k[1] is not None and rep.domain(k[0]) is None}
    return [k for k in rep.quality if k in want]


def _score_columns(keys: list[QualityKey]) -> list[Column]:
    per_bench = {b: sum(1 for (x, _) in keys if x == b) for (b, _) in keys}
    cols = []
    for k in keys:
        col = quality_column(k)
        label = benchmark_name(k[0]) + (f" {k[1]}" if per_bench[k[0]] > 1 else "")
        cols.append(
            Column(
                col.name,
                col.kind,
                label=label + (" (%)" if col.kind == "pct" else ""),
                best="min" if k[1] in RAW_METRICS else "max",
            )
        )
    return cols


def _paper_row(p: PaperCell, keys: list[QualityKey], domain: str, scale: float) -> list[Any]:
    """A reported line in the table's columns; what the paper does not report is blank."""
    # A score of another protocol than the table's (the domain's, e.g. code@evalplus) is
    # "protocol differs", never a number beside ours.
    proto = split_protocol(domain)[1]
    v = {q: (x if p.protocols.get(q, proto) == proto else PROTOCOL_DIFFERS) for q, x in p.values.items()}
    scores = {norm_benchmark(q.split(":", 1)[1]): x for q, x in v.items() if q.startswith("score:")}
    row: list[Any] = [scores.get(norm_benchmark(split_protocol(b)[0]), NOT_EVALUATED) for (b, _) in keys]
    if domain != "other":
        row.append(v.get("avg_score", NOT_EVALUATED))
    row.append(v.get("data_used", NOT_EVALUATED))
    row.append(v["train_time"] * 3600 / scale if "train_time" in v else NOT_EVALUATED)
    row.append(-v["train_time_reduction"] if "train_time_reduction" in v else NOT_EVALUATED)
    return row


def _ours_row(rep: Report, c: Cell, keys: list[QualityKey], domain: str, scale: float) -> list[Any]:
    row: list[Any] = [rep.quality_cell(c, k) for k in keys]
    if domain != "other":
        row.append(rep.domain_cell(c, domain))
    if c.first.method == "base":  # the model before fine-tuning: no data, no training
        return row + [NOT_EVALUATED] * 3
    row += [rep.kept_cell(c), rep.cost_cell(c, "train_s", 1 / scale)]
    less = rep.reduction(c, "train_s")
    row.append(less if less in ("ref", MISSING, DIVERGED) else -less)
    return row


def compact_tables(rep: Report, entries: list[dict[str, Any]]) -> list[Table]:
    """One compact main table per domain present in the results."""
    by_domain: dict[str, list[Cell]] = {}
    for c in rep.cells:
        if in_main(c):
            for d in _domain_of_setting(rep, c):
                by_domain.setdefault(d, []).append(c)
    paper = paper_cells(entries)
    order = {d: i for i, d in enumerate(list(rep.domains) + ["other"])}
    return [
        compact_table(rep, d, by_domain[d], paper) for d in sorted(by_domain, key=lambda d: order.get(d, 99))
    ]


def compact_table(rep: Report, domain: str, cells: list[Cell], paper: list[PaperCell]) -> Table:
    keys = _keys(rep, cells, domain)
    settings = list(dict.fromkeys(_setting_key(c) for c in cells))
    lines = {s: [p for p in paper if (p.dataset, p.model, p.world_size) == s] for s in settings}
    ours_s = [e.value for c in cells if isinstance(e := rep.cost_cell(c, "train_s"), Estimate)]
    paper_s = [p.values["train_time"] * 3600 for ps in lines.values() for p in ps if "train_time" in p.values]
    unit, scale, kind = time_unit(ours_s or paper_s)

    cols = [Column("setting"), Column("source"), Column("method"), Column("method id", csv_only=True)]
    cols += _score_columns(keys)
    if domain != "other":
        cols.append(Column(f"{domain} avg (%)", "pct", label="Avg. (%)", best="max"))
    cols += [
        Column("data used (%)", "pct", label="Data used (%)"),
        Column(f"train time ({unit})", kind, label=f"Train time ({unit})"),
        Column("train time vs full (%)", "delta", label="Δ time vs full (%)"),
    ]
    rows, rankable = [], []
    for s in settings:
        name = setting_name(*s)
        for c in sorted((c for c in cells if _setting_key(c) == s), key=paper_order):
            rows.append([name, OURS, cell_method_name(c), c.label()] + _ours_row(rep, c, keys, domain, scale))
            rankable.append(True)
        for p in lines[s]:
            ident = p.method + (f" r={p.ratio / 100:g}" if p.ratio is not None else "")
            rows.append(
                [name, PAPER, method_name(p.method, p.ratio), ident] + _paper_row(p, keys, domain, scale)
            )
            rankable.append(False)
    # A benchmark of held-out rows' categories (the demo's): titled by its pool.
    what = DOMAIN_TITLES.get(domain) or (f"{domain} pool" if rep.pool_group(domain) else domain)
    title = f"Main results, {what}"
    return Table(
        f"main_compact_{domain.replace('@', '_')}",
        title,
        cols,
        rows,
        group_by=("setting", "source"),
        rankable=rankable,
        caption=(
            "Scores per benchmark and their average (%), the share of the training pool "
            "used, and the training loop's time (selection not included), means over "
            "seeds. Bold: the best of our rows in "
            "each setting and column (the paper's rows are not ranked). Random (r = x): "
            "random data of the size CluSTER (r = x) kept. Paper rows: the numbers the "
            "paper reports for the same setting, not rerun. Δ time: change against full "
            "data (negative: faster)."
        ),
        notes=[
            "CluSTER as the paper runs it (interleaved allocation, rank weights, "
            "peripheral choice); its variants are in the ablation tables, every column in "
            "`main`.",
            "Paper rows transcribed in reports/reported.yaml (section "
            "'Reported numbers') from docs/method.md, not yet checked against the "
            "PDF; blank where the paper does not report the number.",
        ],
    )
