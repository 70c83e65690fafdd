"""What every report table is made of, and the values it shows: `Column` and `Table` (a table as
plain data, which reports/render.py writes), the cell markers (missing, not evaluated, diverged),
and `Report`, which turns the cells (reports/load.py) into the quality columns, per-run and
per-cell values (scores, domain averages, costs, diagnostics) and the references a difference is
taken against (full data; random at the same kept count). reports/tables.py builds the tables
from it.

Units: quality scores in percent (fractions in the rows x 100), except loss and perplexity as they
are; costs as the rows state them, scaled where a caller asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reports.load import Cell
from reports.runs import POOL_KIND, RAW_METRICS, Run, domain_of
from reports.stats import Estimate, SeedDiff, item_diff, mean_ci, paired_diff

MISSING = None
NOT_EVALUATED = ""
DIVERGED = "diverged"
# A cell whose runs scored a benchmark with different eval settings (limit, items, shots, ...):
# their mean would mix two measurements, so none is shown.
MIXED = "mixed eval settings"
# The cost columns a training measures (a diverged run's are not a finished run's).
TRAINING_COSTS = ("train_s", "end_to_end_s", "eval_s", "tokens_per_s", "allreduce_wait_share", "peak_mem_mb")


@dataclass
class Column:
    """One column. `name` is its CSV header (ids, stable for scripts); `label` what Markdown and
    LaTeX print (display names; defaults to name). best: "max" or "min" for a quality column whose
    best value per block is set in bold; csv_only: left out of Markdown and LaTeX."""

    name: str
    # text | int | pct | num | num0 | num2 | sig | sec | min | hours | mb | delta | delta2 | joules
    kind: str = "text"
    label: str | None = None
    best: str | None = None
    csv_only: bool = False

    @property
    def shown(self) -> str:
        return self.label or self.name


@dataclass
class Table:
    """A table as data. caption: what LaTeX's caption adds to the title (e.g. what bold means).
    group_by: names of columns whose values LaTeX prints as block headings instead of a column
    (outermost first), and within which the best values are set in bold. rankable: per row,
    whether it competes for bold (e.g. not the paper's reported rows); None: every row."""

    name: str
    title: str
    columns: list[Column]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)
    caption: str = ""
    group_by: tuple[str, ...] = ()
    rankable: list[bool] | None = None


QualityKey = tuple[str, str | None]  # (benchmark, metric); metric None: only 'missing' rows known


def _scale(metric: str | None) -> float:
    return 1.0 if metric in RAW_METRICS else 100.0


def setting(run: Run) -> str:
    return f"{run.dataset} · {run.model}"


class Report:
    """Everything the tables share: the cells, their quality columns, references for differences."""

    def __init__(self, cells: list[Cell]) -> None:
        self.cells = cells
        metrics: dict[str, set[str]] = {}
        for c in cells:
            for r in c.runs:
                for b, m in r.scores:
                    metrics.setdefault(b, set()).add(m)
                for b in r.missing:
                    metrics.setdefault(b, set())
        # The kinds the rows state (plugin benchmarks), for `domain`.
        self.kinds = {b: k for c in cells for r in c.runs for b, k in r.kinds.items()}
        self.quality: list[QualityKey] = []
        order = self._domain_order
        for b in sorted(metrics, key=lambda b: (order(self.domain(b)), b)):
            ms = sorted(metrics[b]) or [None]
            self.quality += [(b, m) for m in ms]
        # Benchmarks each setting evaluates (a run lacking one of them is missing, not n/a).
        self.expected: dict[tuple[str, str], set[str]] = {}
        for c in cells:
            exp = self.expected.setdefault((c.first.dataset, c.first.model), set())
            for r in c.runs:
                exp |= {b for (b, _) in r.scores} | r.missing
        self.domains = sorted({d for (b, _) in self.quality if (d := self.domain(b))}, key=order)

    def domain(self, benchmark: str) -> str | None:
        """The benchmark's domain (reports/load.py domain_of), by name or by its rows' kind."""
        return domain_of(benchmark, self.kinds)

    def pool_group(self, domain: str) -> bool:
        """Whether `domain` is the group of a benchmark of held-out rows (the demo's categories)."""
        return any(k == POOL_KIND and b.partition("/")[0] == domain for b, k in self.kinds.items())

    def _domain_order(self, domain: str | None) -> int:
        """Where a domain's columns and table go: code, medical, a benchmark of held-out rows'
        group (the demo's), then the rest."""
        if domain in ("code", "medical"):
            return 0 if domain == "code" else 1
        return 2 if domain is not None and self.pool_group(domain) else 3

    # -- per-run values ------------------------------------------------------------------
    def run_value(self, r: Run, key: QualityKey) -> float | None:
        b, m = key
        if b in r.missing or m is None:
            return None
        v = r.score(b, m)
        return None if v is None else v * _scale(m)

    def domain_keys(self, r: Run, domain: str) -> list[QualityKey]:
        exp = self.expected.get((r.dataset, r.model), set())
        return [
            (b, m)
            for (b, m) in self.quality
            if self.domain(b) == domain and b in exp and m not in RAW_METRICS
        ]

    def run_domain_avg(self, r: Run, domain: str) -> float | None:
        keys = self.domain_keys(r, domain)
        vals = [self.run_value(r, k) for k in keys]
        if not keys or any(v is None for v in vals):
            return None  # an average over part of a domain would mislead
        return float(np.mean(vals))

    # -- per-cell values -----------------------------------------------------------------
    @staticmethod
    def diverged(c: Cell) -> bool:
        """Whether a run of the cell diverged: it has no scores, so its cells say so."""
        return any(r.status == "diverged" for r in c.runs)

    @staticmethod
    def same_settings(runs: list[Run], benchmarks: list[str]) -> bool:
        """Whether every run that scored each benchmark did so with the same eval settings."""
        return all(len({r.variants[b] for r in runs if b in r.variants}) <= 1 for b in benchmarks)

    def quality_cell(self, c: Cell, key: QualityKey) -> Any:
        if key[0] not in self.expected.get((c.first.dataset, c.first.model), set()):
            return NOT_EVALUATED
        if self.diverged(c):
            return DIVERGED
        if not self.same_settings(c.runs, [key[0]]):
            return MIXED
        return mean_ci([self.run_value(r, key) for r in c.runs], f"{c.key}|{key}")

    def domain_cell(self, c: Cell, domain: str) -> Any:
        if not self.domain_keys(c.first, domain):
            return NOT_EVALUATED
        if self.diverged(c):
            return DIVERGED
        if not self.same_settings(c.runs, [b for b, _ in self.domain_keys(c.first, domain)]):
            return MIXED
        return mean_ci([self.run_domain_avg(r, domain) for r in c.runs], f"{c.key}|avg|{domain}")

    def run_counts(self, c: Cell) -> tuple[int | None, int | None]:
        """(most attempts, latest resume step) over the cell's runs; None where rows lack them."""
        att = [r.attempts for r in c.runs if r.attempts is not None]
        res = [r.resumed_from_step for r in c.runs if r.resumed_from_step is not None]
        return (max(att) if att else None), (max(res) if res else None)

    def cost_cell(self, c: Cell, col: str, scale: float = 1.0) -> Estimate | str | None:
        """Mean over seeds of a cost column; DIVERGED for what training measures in a cell with a
        diverged run (its training stopped early: never a finished run's cost)."""
        if col in TRAINING_COSTS and self.diverged(c):
            return DIVERGED
        vals = [r.costs.get(col) for r in c.runs]
        return mean_ci([None if v is None else v * scale for v in vals], f"{c.key}|{col}")

    def diag_cell(self, c: Cell, bench: str, metric: str, scale: float = 1.0) -> Estimate | str | None:
        trained = bench == "cost/train" or (
            bench.startswith("worker/") and not metric.startswith("predicted_idle")
        )
        if trained and self.diverged(c):
            return DIVERGED
        vals = [r.diag.get((bench, metric)) for r in c.runs]
        return mean_ci([None if v is None else v * scale for v in vals], f"{c.key}|{bench}|{metric}")

    def fsdp(self, c: Cell) -> bool:
        """Whether c trained with train.strategy fsdp, which does not measure the all-reduce
        wait (the pipeline's `cost/train` `fsdp` row is 1): its wait cells say so, never 0."""
        return any(r.diag.get(("cost/train", "fsdp")) == 1 for r in c.runs)

    def per_step_cell(self, c: Cell, bench: str, metric: str) -> Estimate | str | None:
        """A per-worker total divided by the run's optimizer steps (the row's n), mean over
        seeds: seconds per step, so runs of different lengths compare. Missing without n."""
        if self.diverged(c):
            return DIVERGED
        vals = []
        for r in c.runs:
            v, n = r.diag.get((bench, metric)), r.diag_n.get((bench, metric))
            vals.append(v / n if v is not None and n else None)
        return mean_ci(vals, f"{c.key}|{bench}|{metric}|per-step")

    def kept_cell(self, c: Cell) -> Estimate | None:
        return mean_ci(
            [None if r.kept_fraction is None else 100 * r.kept_fraction for r in c.runs], f"{c.key}|kept"
        )

    # -- references ----------------------------------------------------------------------
    def full_cell(self, c: Cell) -> Cell | None:
        f = c.first
        for o in self.cells:
            if o.first.method == "full" and (o.first.dataset, o.first.model, o.first.world_size) == (
                f.dataset,
                f.model,
                f.world_size,
            ):
                return o
        return None

    def reference_run(self, r: Run, which: str) -> Run | None:
        """The run that r is compared with at the same seed: full data, or random at r's kept count."""
        for o in self.cells:
            for x in o.runs:
                if (x.dataset, x.model, x.world_size, x.seed) != (r.dataset, r.model, r.world_size, r.seed):
                    continue
                if which == "full" and x.method == "full":
                    return x
                if which == "random" and x.method == "random" and x.n_selected == r.n_selected:
                    return x
        return None

    def paired(self, c: Cell, which: str, keys: list[QualityKey]) -> Estimate | None:
        """Mean difference of c minus its reference over keys' (average), one difference per
        seed (reports/stats.py paired_diff); each seed's formed from its items (a problem of a
        benchmark and its plus variant one unit) where both runs have per-item scores for every
        key, which gives a single seed an interval over its items (item noise only)."""
        benches = [b for b, _ in keys]
        pairs = [
            (r, ref)
            for r in c.runs
            if (ref := self.reference_run(r, which)) is not None
            and ref.run_id != r.run_id
            and self.same_settings([r, ref], benches)  # scores made alike, or no pair
        ]
        if not pairs or not keys:
            return None
        tag = f"{c.key}|{which}|{keys}"
        if all(b in r.items and b in ref.items for r, ref in pairs for (b, _) in keys):
            seeds: list[SeedDiff] = []
            for r, ref in pairs:
                d = item_diff(
                    {
                        b: {
                            i: _scale(m) * (r.items[b][i] - ref.items[b][i])
                            for i in sorted(r.items[b].keys() & ref.items[b].keys())
                        }
                        for b, m in keys
                    }
                )
                if d is None:
                    return None
                seeds.append(d)
            return paired_diff(seeds, tag)
        diffs = []
        for r, ref in pairs:
            vals = [(self.run_value(r, k), self.run_value(ref, k)) for k in keys]
            if all(a is not None and b is not None for a, b in vals):
                diffs.append(float(np.mean([a - b for a, b in vals])))
        return paired_diff(diffs, tag) if diffs else None

    def reduction(self, c: Cell, col: str) -> Any:
        """Percent less than full data (mean over seeds of each), or 'ref' for full itself."""
        if c.first.method == "full":
            return "ref"
        if self.diverged(c):  # its training stopped early: no time to compare
            return DIVERGED
        full = self.full_cell(c)
        ours = self.cost_cell(c, col)
        ref = self.cost_cell(full, col) if full else None
        if not isinstance(ours, Estimate) or not isinstance(ref, Estimate) or ref.value <= 0:
            return DIVERGED if ref == DIVERGED else MISSING
        return 100 * (1 - ours.value / ref.value)
