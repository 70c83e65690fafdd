"""The report's tables, built from cells (reports/load.py) as plain data; reports/render.py writes them.
What a table is made of (Column, Table) and the values it shows (Report) live in
reports/values.py.

Units: quality scores in percent (fractions in the rows x 100), except loss and perplexity as they
are; times in seconds; memory in MB; energy in joules; differences in points (percent units).
A table cell is a str, an int/float, an `Estimate` (mean over seeds with its interval, or a paired
difference) or None, which renders as missing ("—"); "" means "not evaluated in this setting";
"diverged" marks the quality cells of a cell with a run whose training diverged (no scores).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from reports.load import Cell
from reports.names import benchmark_name
from reports.runs import RAW_METRICS, Run
from reports.stats import Estimate, mean_ci
from reports.values import (
    DIVERGED,
    MISSING,
    NOT_EVALUATED,
    Column,
    QualityKey,
    Report,
    Table,
    setting,
)

# ----------------------------------------------------------------------------- the tables


def at_a_budget(c: Cell) -> bool:
    """Whether random at the same kept count is a reference for c: CluSTER at a ratio, or a
    baseline placed at a budget (`@r=0.5`, `@n=40`); not full data or the base model."""
    return c.first.ratio is not None or bool(c.first.budget)


def _ident(c: Cell) -> list[Any]:
    r = c.first
    return [setting(r), c.label(), r.allocator, r.weight_mode, r.world_size, len(c.runs)]


IDENT_COLS = [
    Column("setting"),
    Column("method"),
    Column("allocator"),
    Column("weights"),
    Column("workers", "int"),
    Column("seeds", "int"),
]


def quality_column(key: QualityKey) -> Column:
    """A score's column: the benchmark id and metric in CSV, its display name elsewhere."""
    b, m = key
    bare = m is None or m in ("exact_or_exec",)
    name = b if bare else f"{b} {m}"
    label = benchmark_name(b) if bare else f"{benchmark_name(b)} {m}"
    unit = "" if m in RAW_METRICS else " (%)"
    return Column(name + unit, "num" if m in RAW_METRICS else "pct", label=label + unit)


def main_table(rep: Report) -> Table:
    cols = IDENT_COLS + [Column("data used (%)", "pct")]
    cols += [quality_column(k) for k in rep.quality]
    cols += [Column(f"{d} avg (%)", "pct") for d in rep.domains]
    cols += [
        Column("train s", "sec"),
        Column("selection s", "sec"),
        Column("end-to-end s", "sec"),
        Column("train time vs full (% less)", "pct"),
        Column("end-to-end vs full (% less)", "pct"),
    ]
    for d in rep.domains:
        cols += [Column(f"Δ {d} avg vs full", "delta"), Column(f"Δ {d} avg vs random", "delta")]
    rows = []
    for c in rep.cells:
        row = _ident(c) + [rep.kept_cell(c)]
        row += [rep.quality_cell(c, k) for k in rep.quality]
        row += [rep.domain_cell(c, d) for d in rep.domains]
        row += [
            rep.cost_cell(c, "train_s"),
            rep.cost_cell(c, "selection_s"),
            rep.cost_cell(c, "end_to_end_s"),
            rep.reduction(c, "train_s"),
            rep.reduction(c, "end_to_end_s"),
        ]
        for d in rep.domains:
            keys = rep.domain_keys(c.first, d)
            row.append(
                "ref"
                if c.first.method == "full"
                else (DIVERGED if rep.diverged(c) else rep.paired(c, "full", keys))
                if keys
                else NOT_EVALUATED
            )
            row.append(
                "ref"
                if c.first.method == "random"
                else (DIVERGED if rep.diverged(c) else rep.paired(c, "random", keys))
                if keys and at_a_budget(c)
                else NOT_EVALUATED
            )
        rows.append(row)
    return Table(
        "main",
        "Main results: quality, data used and time per method and ratio",
        cols,
        rows,
        notes=[
            "Train time is the training loop alone (as the paper reports it); selection "
            "(features, clustering, choice, allocation; a feature pass reused from a shared "
            "features job counts as its device-seconds / workers) is separate; end-to-end adds "
            "data loading, start-up and evaluation.",
            "Δ: paired difference in points against full data and against random at the "
            "same kept count, same seed.",
            "base: the model before fine-tuning (`cluster-repro eval --model`), shown in "
            "each setting that fine-tunes it, on the benchmarks that setting reports on "
            "the same number of items.",
        ],
    )


def differences_table(rep: Report) -> Table:
    cols = IDENT_COLS + [
        Column("benchmark"),
        Column("vs"),
        Column("ours", "pct"),
        Column("reference", "pct"),
        Column("difference", "delta"),
        Column("paired on"),
    ]
    rows = []
    for c in rep.cells:
        refs = [
            w
            for w in ("full", "random")
            if not (w == c.first.method or (w == "random" and not at_a_budget(c)))
        ]
        targets = [(f"{d} avg", rep.domain_keys(c.first, d), d) for d in rep.domains]
        targets += [(quality_column(k).name, [k], None) for k in rep.quality if k[1] is not None]
        for which in refs:
            ref_runs = [x for r in c.runs if (x := rep.reference_run(r, which))]
            for name, keys, dom in targets:
                if not keys or keys[0][0] not in rep.expected.get((c.first.dataset, c.first.model), set()):
                    continue
                if dom is not None:
                    ours = rep.domain_cell(c, dom)
                    ref = mean_ci([rep.run_domain_avg(x, dom) for x in ref_runs], f"ref{name}")
                else:
                    ours = rep.quality_cell(c, keys[0])
                    ref = mean_ci([rep.run_value(x, keys[0]) for x in ref_runs], f"ref{name}")
                d = DIVERGED if rep.diverged(c) else rep.paired(c, which, keys)
                rows.append(
                    _ident(c)
                    + [name, which, ours, ref, d, f"{d.unit} (n={d.n})" if d and d != DIVERGED else MISSING]
                )
    return Table(
        "differences",
        "Paired differences against full data and random at the same budget",
        cols,
        rows,
        notes=[
            "95% Student-t interval over the seeds' paired differences (each seed's from its "
            "items where both runs have per-item scores); one seed with per-item scores: over "
            "its items, which covers item noise only (paired on items); one seed without: no "
            "interval.",
            "Scores and differences in percent / points; loss and perplexity in their "
            "own units (lower is better).",
        ],
    )


def overhead_table(rep: Report) -> Table:
    cols = IDENT_COLS + [
        Column("features s", "sec"),
        Column("clustering s", "sec"),
        Column("choice s", "sec"),
        Column("allocation s", "sec"),
        Column("selection total s", "sec"),
        Column("selection share of end-to-end (%)", "pct"),
        Column("peak memory MB", "mb"),
        Column("features peak MB", "mb"),
        Column("clustering peak MB", "mb"),
        Column("train energy J", "joules"),
        Column("all-reduce wait (%)", "pct"),
        Column("predicted idle (%)", "pct"),
        Column("attempts", "int"),
        Column("resumed from step", "int"),
    ]
    rows = []
    for c in rep.cells:
        if c.first.method == "base":
            continue  # the untuned model: nothing selected or trained
        sel, e2e = rep.cost_cell(c, "selection_s"), rep.cost_cell(c, "end_to_end_s")
        energy = rep.diag_cell(c, "cost/train", "energy_j")
        rows.append(
            _ident(c)
            + [
                rep.diag_cell(c, "cost/features", "seconds"),
                rep.diag_cell(c, "cost/clustering", "seconds"),
                rep.diag_cell(c, "cost/selection", "seconds"),
                rep.diag_cell(c, "cost/allocation", "seconds"),
                sel,
                (
                    100 * sel.value / e2e.value
                    if isinstance(sel, Estimate) and isinstance(e2e, Estimate) and e2e.value > 0
                    else DIVERGED
                    if e2e == DIVERGED
                    else MISSING
                ),
                rep.cost_cell(c, "peak_mem_mb"),
                rep.diag_cell(c, "cost/features", "peak_mem_mb"),
                rep.diag_cell(c, "cost/clustering", "peak_mem_mb"),
                energy if energy is not None else "not measured",
                NOT_MEASURED_FSDP if rep.fsdp(c) else rep.cost_cell(c, "allreduce_wait_share", 100),
                rep.cost_cell(c, "predicted_idle_share", 100),
                *rep.run_counts(c),
            ]
        )
    return Table(
        "overhead",
        "Selection overhead: seconds, memory and energy",
        cols,
        rows,
        notes=[
            "choice s: keeping m_adj examples per cluster; selection total = select + schedule stages "
            "(+ a feature pass reused from a shared features job, its device-seconds / workers).",
            "Energy comes from GPU energy counters (NVML) around training; where no GPU reports it "
            "the cell says 'not measured' (never estimated). Peak memory: process RSS on CPU, "
            "allocated device memory on GPU; step peaks from Python's tracemalloc.",
            "all-reduce wait: the measured share of step time the workers waited at the gradient "
            "all-reduce; predicted idle: its prediction before training, the mean over optimizer "
            "steps of 1 - mean/max of the workers' token sums (repro/core/steps.py; one worker: "
            "missing). n/a (fsdp): the wait is not measured.",
            "attempts: how often a run was started before it finished (1: never interrupted), and "
            "the step its training resumed from (0: none), the largest over the cell's seeds; the "
            "seconds of a resumed run add up every attempt (docs/files.md).",
        ],
    )


NOT_MEASURED_FSDP = "n/a (fsdp)"


def balance_table(rep: Report) -> Table:
    """Per worker: tokens per step, and the all-reduce wait per optimizer step (seconds, and as a
    share of the step), so a 20-step run and a 4-step run with the same per-step wait read the
    same. Under fsdp the wait is not measured: "n/a (fsdp)", never 0."""
    cols = IDENT_COLS + [
        Column("worker", "int"),
        Column("steps"),
        Column("tokens / step", "num0"),
        Column("vs mean of workers (%)", "delta"),
        Column("all-reduce wait / step s", "sec"),
        Column("compute / step s", "sec"),
        Column("wait share of step (%)", "pct"),
        Column("predicted idle (%)", "pct"),
    ]
    rows = []
    for c in rep.cells:
        if rep.diverged(c):  # its training stopped early: no per-worker balance to show
            rows.append(_ident(c) + [MISSING, MISSING] + [DIVERGED] * 5 + [MISSING])
            continue
        workers = sorted(
            {
                int(b.split("/")[1])
                for r in c.runs
                for (b, _) in r.diag
                if b.startswith("worker/") and b.split("/")[1].isdigit()
            }
        )
        toks = {k: rep.diag_cell(c, f"worker/{k}", "tokens_per_step") for k in workers}
        mean_tok = np.mean([t.value for t in toks.values() if t]) if any(toks.values()) else None
        fsdp = rep.fsdp(c)
        for k in workers:
            b = f"worker/{k}"
            steps = sorted({n for r in c.runs if (n := r.diag_n.get((b, "tokens_per_step")))})
            wait = rep.per_step_cell(c, b, "allreduce_wait_s")
            comp = rep.per_step_cell(c, b, "compute_s")
            total_wait = rep.diag_cell(c, b, "allreduce_wait_s")
            total_comp = rep.diag_cell(c, b, "compute_s")
            share = (
                100 * total_wait.value / (total_wait.value + total_comp.value)
                if total_wait and total_comp and total_wait.value + total_comp.value > 0
                else MISSING
            )
            t = toks[k]
            rows.append(
                _ident(c)
                + [
                    k,
                    "/".join(str(n) for n in steps) if steps else MISSING,
                    t,
                    100 * (t.value / mean_tok - 1) if t and mean_tok else MISSING,
                    NOT_MEASURED_FSDP if fsdp else wait,
                    comp,
                    NOT_MEASURED_FSDP if fsdp else share,
                    rep.diag_cell(c, b, "predicted_idle_share", 100),
                ]
            )
    return Table(
        "balance",
        "Per-worker balance: tokens per step and waiting at the all-reduce",
        cols,
        rows,
        notes=[
            "tokens / step: non-padding tokens a worker processes per optimizer step, "
            "mean over steps (and seeds). all-reduce wait / step: seconds from the "
            "worker's last gradient bucket being ready until the synchronized gradients "
            "were back, mean per optimizer step (the run's total over its steps), then "
            "over seeds; compute / step likewise; wait share: wait / (wait + compute).",
            "steps: optimizer steps each seed's run logged (several: the seeds differ).",
            "predicted idle: the worker's share of step time spent waiting for the "
            "slowest worker, predicted from the schedule and token counts before "
            "training (mean over steps of 1 - its tokens / the step's most; "
            "repro/core/steps.py), beside the measured wait share.",
            "n/a (fsdp): train.strategy fsdp does not measure the wait (its compute / "
            "step is the whole step, communication included).",
        ],
    )


def _summary_cols(rep: Report) -> tuple[list[Column], Callable[[Cell], list[Any]]]:
    """Quality summary for ablations: domain averages and benchmarks outside any domain."""
    other = [k for k in rep.quality if rep.domain(k[0]) is None]
    cols = [Column("data used (%)", "pct")] + [Column(f"{d} avg (%)", "pct") for d in rep.domains]
    cols += [quality_column(k) for k in other]
    cols += [
        Column("train s", "sec"),
        Column("end-to-end s", "sec"),
        Column("tokens/s", "num0"),
        Column("all-reduce wait (%)", "pct"),
        Column("predicted idle (%)", "pct"),
    ]

    def values(c: Cell) -> list[Any]:
        return (
            [rep.kept_cell(c)]
            + [rep.domain_cell(c, d) for d in rep.domains]
            + [rep.quality_cell(c, k) for k in other]
            + [
                rep.cost_cell(c, "train_s"),
                rep.cost_cell(c, "end_to_end_s"),
                rep.cost_cell(c, "tokens_per_s"),
                NOT_MEASURED_FSDP if rep.fsdp(c) else rep.cost_cell(c, "allreduce_wait_share", 100),
                rep.cost_cell(c, "predicted_idle_share", 100),
            ]
        )

    return cols, values


def _prune(r: Run) -> str | None:
    return str(r.params.get("prune", "close")) if r.method == "cluster" else None


def _alloc(r: Run) -> str:
    """The allocator's params (balance), part of every ablation group's identity."""
    return json.dumps(r.alloc_params, sort_keys=True)


def _identity(r: Run, without: tuple[str, ...]) -> tuple:
    """What an ablation group's cells share: the run's setting, method, ratio, selector params,
    budget, allocator, allocator params and weighting, less the fields `without` names (the factor
    the ablation varies, and what varies with it); "prune" drops that key from the params."""
    params = {k: v for k, v in r.params.items() if not (k == "prune" and "prune" in without)}
    fields = {
        "dataset": r.dataset,
        "model": r.model,
        "world_size": r.world_size,
        "method": r.method,
        "ratio": r.ratio,
        "params": json.dumps(params, sort_keys=True),
        "budget": r.budget,
        "allocator": r.allocator,
        "alloc": _alloc(r),
        "weight_mode": r.weight_mode,
    }
    return tuple(v for k, v in fields.items() if k not in without)


# name, title, the factor, and the identity of a cell without that factor
ABLATIONS: list[tuple[str, str, Callable[[Run], Any], Callable[[Run], tuple]]] = [
    (
        "ablation_weighting",
        "Ablation: rank weighting of worker gradients on/off",
        lambda r: r.weight_mode,
        lambda r: _identity(r, ("weight_mode",)),
    ),
    (
        "ablation_choice",
        "Ablation: which examples a cluster keeps (close = peripheral, far = core)",
        _prune,
        lambda r: _identity(r, ("prune", "budget")),  # CluSTER only: a ratio, no budget
    ),
    (
        "ablation_allocator_selector",
        "Ablation: allocator crossed with selector",
        lambda r: r.allocator,
        lambda r: _identity(r, ("allocator", "weight_mode")),
    ),
    (
        "ablation_workers",
        "Ablation: 4 vs 8 data-parallel workers",
        lambda r: r.world_size,
        lambda r: _identity(r, ("world_size",)),
    ),
]


def ablation_table(
    rep: Report, name: str, title: str, factor: Callable[[Run], Any], rest: Callable[[Run], tuple]
) -> Table:
    """Cells that agree on everything but the factor, in groups with at least two levels."""
    groups: dict[tuple, list[Cell]] = {}
    for c in rep.cells:
        if factor(c.first) is None:
            continue
        groups.setdefault(tuple(str(x) for x in rest(c.first)), []).append(c)
    scols, values = _summary_cols(rep)
    cols = [Column("group", "int")] + IDENT_COLS + [Column("level")] + scols
    rows, g = [], 0
    for key in sorted(groups):
        cells = groups[key]
        if len({str(factor(c.first)) for c in cells}) < 2:
            continue
        g += 1
        for c in sorted(cells, key=lambda c: str(factor(c.first))):
            rows.append([g] + _ident(c) + [str(factor(c.first))] + values(c))
    notes = (
        []
        if rows
        else [
            "No runs vary this factor alone yet (run the ablation grid, e.g. "
            "configs/experiments/demo-ablation.yaml, then report again)."
        ]
    )
    return Table(
        name, title, cols, rows, notes=notes + ["Rows with the same group number differ only in the level."]
    )


def drop_blank_columns(t: Table) -> Table:
    """Leave out columns that are "not evaluated" in every row (e.g. code benchmarks in a report
    of demo runs only); missing cells (None) keep their column."""
    if not t.rows:
        return t
    keep = [i for i in range(len(t.columns)) if any(row[i] != NOT_EVALUATED for row in t.rows)]
    return replace(t, columns=[t.columns[i] for i in keep], rows=[[row[i] for i in keep] for row in t.rows])


# How a schema column type shows in the runs table.
_RUN_COLUMN_KIND = {"str": "text", "json": "text", "int": "int", "float": "sig"}


def runs_table(runs: list[Run]) -> Table:
    """One line per run with every run-scope column of the result rows' schema
    (repro/core/schema.py), typed as the schema says: a column added to the schema shows here with
    no other edit. JSON settings and the provenance columns are in the CSV only."""
    from repro.core import schema

    cols = schema.columns(scope="run")
    columns = [
        Column(c.name, _RUN_COLUMN_KIND[c.type], csv_only=c.type == "json" or c.role == "provenance")
        for c in cols
    ]
    rows = []
    for r in sorted(runs, key=lambda x: x.run_id):
        line: list[Any] = []
        for c in cols:
            v = r.columns.get(c.name)
            line.append(
                json.dumps(v, sort_keys=True, separators=(",", ":"))
                if c.type == "json" and v is not None
                else v
            )
        rows.append(line)
    return Table(
        "runs",
        "Runs",
        columns,
        rows,
        notes=["Every run's settings, costs and outcome, as its result rows state them (docs/reports.md)."],
    )
