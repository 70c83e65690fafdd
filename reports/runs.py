"""What the report knows of a run before it reads any file: the `Run` record (its settings,
costs, scores and diagnostic numbers), the benchmark-name helpers (normalized names, the protocol
suffix, the paper's domains), which rows are diagnostics, the cost columns, and
`ReportInputError`. reports/load.py reads the results store into these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core import schema
from repro.core.errors import UserError
from repro.core.results import DIAGNOSTIC_PREFIXES, REQUIRED_COLUMNS

# Metrics reported as they are (lower is better); every other metric is a fraction shown as %.
RAW_METRICS = ("loss", "perplexity")
# Required columns: what a row must have for the report to place it.
REQUIRED = REQUIRED_COLUMNS
# The paper's domains: normalized benchmark name (lowercase, "+" -> "plus", no punctuation).
DOMAINS = {
    "code": ("humaneval", "humanevalplus", "mbpp", "mbppplus"),
    "medical": ("medqa", "medqa4options", "medmcqa", "pubmedqa", "mmlumedical"),
}
# The kind a benchmark of held-out rows may state (evals/plugins.py POOL_KIND): its rows
# `<name>/<category>` form a group of their own, named `<name>`; `<name>/overall` pools them.
POOL_KIND = "pool"


class ReportInputError(UserError, ValueError):
    """A results file or row the report cannot use; the message names the file, row and column."""


def norm_benchmark(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("+", "plus"))


def split_protocol(benchmark: str) -> tuple[str, str]:
    """(benchmark, protocol) of a report key: a row scored under a protocol other than lm-eval
    is keyed `<benchmark>@<protocol>` (build_runs), so no table averages or compares across
    protocols: its domain is `<domain>@<protocol>` too."""
    base, _, proto = benchmark.partition("@")
    return base, proto or "lm-eval"


def domain_of(benchmark: str, kinds: dict[str, str] | None = None) -> str | None:
    """'code', 'medical', a benchmark of held-out rows' group (the categories `demo/<c>` of the
    demo's tasks form the group `demo`; its pooled `demo/overall` is in none), or None.
    `kinds`: benchmark -> the kind its rows state (`benchmark_kind`, Run.kinds), which places a
    benchmark the paper's domains do not list (a plugin's: docs/add-a-benchmark.md).
    `<benchmark>@<protocol>`: `<domain>@<protocol>`."""
    if "@" in benchmark:
        dom = domain_of(split_protocol(benchmark)[0], kinds)
        return dom and f"{dom}@{split_protocol(benchmark)[1]}"
    if (kinds or {}).get(benchmark) == POOL_KIND:
        group, _, category = benchmark.partition("/")
        return None if category in ("", "overall") else group
    key = norm_benchmark(benchmark)
    for dom, names in DOMAINS.items():
        if key in names:
            return dom
    kind = (kinds or {}).get(benchmark)
    return kind if kind in DOMAINS else None


def is_diagnostic(benchmark: str) -> bool:
    return benchmark.startswith(DIAGNOSTIC_PREFIXES)


@dataclass
class Run:
    """One run (one config and seed): its settings, costs, scores and diagnostic numbers."""

    run_id: str
    config_hash: str
    name: str
    dataset: str
    model: str
    method: str
    params: dict[str, Any]
    allocator: str
    weight_mode: str
    ratio: float | None
    world_size: int | None
    seed: int
    kept_fraction: float | None
    n_selected: int | None
    n_pool: int | None
    costs: dict[str, float | None]
    lm_eval: str | None
    versions: dict[str, str]
    git_sha: str
    # (benchmark, metric) -> value (None: the benchmark was missing for this run)
    scores: dict[tuple[str, str], float | None] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    diag: dict[tuple[str, str], float] = field(default_factory=dict)
    # (benchmark, metric) -> the diagnostic row's n (worker/<k> rows: optimizer steps)
    diag_n: dict[tuple[str, str], int] = field(default_factory=dict)
    # benchmark -> items scored (the row's n), where the row says
    n_items: dict[str, int] = field(default_factory=dict)
    # benchmark -> its kind (code, medical, other), where its rows state one (benchmark_kind)
    kinds: dict[str, str] = field(default_factory=dict)
    # benchmark -> {item id: score}, from the run folder's per-item file when there is one
    items: dict[str, dict[str, float]] = field(default_factory=dict)
    budget: str = ""  # set by group_cells for budget-taking baselines
    status: str = "ok"  # "diverged": training stopped on a non-finite loss or gradient norm
    diverged_step: int | None = None
    attempts: int | None = None  # starts of the run until it finished (1: never interrupted)
    resumed_from_step: int | None = None  # the step its training resumed from (0: none)
    alloc_params: dict[str, Any] = field(default_factory=dict)  # allocation.params (balance)
    # steps x workers token sums, from the run folder's step_tokens.json when it is there
    step_tokens: list[list[int]] | None = None
    # The seeds its select/schedule and train stages used
    selection_seed: int | None = None
    training_seed: int | None = None
    # Every run-scope column of the schema, typed (repro/core/schema.py): the runs table shows
    # them all, so a column added to the schema reaches the report with no other edit.
    columns: dict[str, Any] = field(default_factory=dict)
    # From the stored config (reports/load.py): how its budget was matched to another run
    # (`selection.matched`), the rest of its config flattened (`train.lr`, ...: what tells two
    # cells of one label apart), and the whole config as it ran.
    matched: dict[str, Any] | None = None
    rest: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None  # its run folder, where the store has it
    rows: list[dict[str, str]] = field(default_factory=list)  # every row of it, as text
    # benchmark key -> the settings (limit, items, shots, ...) and the eval id its score is from
    variants: dict[str, str] = field(default_factory=dict)
    eval_ids: dict[str, str] = field(default_factory=dict)
    # benchmark key -> the version of its data file, where the rows state one (MBPP+, HumanEval+)
    data_versions: dict[str, str] = field(default_factory=dict)
    # Seconds of a reused feature pass added to costs' selection_s and end_to_end_s (its
    # device-seconds over this run's workers: reports/load.py `count_reused_features`); 0: none
    reused_features_s: float = 0.0

    def score(self, benchmark: str, metric: str) -> float | None:
        return self.scores.get((benchmark, metric))


# A feature pass the run reused (a shared features job under `launch`, or an earlier run of the
# same features): its device-seconds, in a cost/select row (repro/run_rows.py). The run's own
# select stage did not compute it, so its rows' `selection_s` leaves it out; reports/load.py
# adds it back (`count_reused_features`), so every table, figure, claim and board counts it once.
SHARED_FEATURES = ("cost/select", "shared_features_device_s")


def cost_columns() -> list[str]:
    """The cost columns (seconds, throughput, shares, memory): the schema's columns of role
    "cost", read when called (a column added to the schema is one of them at once)."""
    return [c.name for c in schema.columns(role="cost")]
