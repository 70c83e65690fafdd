"""The result rows' schema: every column once, with its type, unit and meaning.

A result row is one (run, benchmark, metric) with the run's settings, provenance and costs
(repro/core/results.py writes and merges them; reports/load.py reads them). This table is the one
place a column is declared: the CSV writer's header and type check, the parquet dtypes, the
reports' parsing, the reports' cost columns and runs table, and the column table in
docs/reports.md (`cluster-repro ls columns` prints it; a test keeps the doc equal) all come from
it. Adding a column is one entry here.

Types: `str`, `int`, `float`, and `json` (a string holding canonical JSON: sorted keys, no
spaces). An empty CSV field is a missing value (None), never zero.

Scopes: `run` columns hold the same value on every row of a run (its settings, costs,
provenance); `row` columns differ per row (what was measured and its value).
Roles: `id` (names the run), `setting` (what was run), `measure` (the row's own benchmark, metric,
value), `cost` (what the run cost: the reports' overhead columns), `outcome` (how the run ended),
`provenance` (where and with what it ran).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

ColumnType = Literal["str", "int", "float", "json"]
Scope = Literal["run", "row"]
Role = Literal["id", "setting", "measure", "cost", "outcome", "provenance"]

# The version of the results this suite writes: result files (their checksum sidecar), run folders
# (run.json), model evaluations (eval.json) and merged sets (their manifest and runs.jsonl) state
# it. Readers refuse another one with the command that rebuilds it (repro/core/store.py).
# Version 3: a registered data source's settings are its params (data.sources[].params), the
# demo's held-out tasks a benchmark (eval.benchmarks), so a config hashes otherwise than in 2.
VERSION = 3

# pandas dtype of each column type in results.parquet.
PARQUET_DTYPES: dict[str, str] = {"str": "string", "json": "string", "int": "Int64", "float": "float64"}


class RowSchemaError(ValueError):
    """A value that does not fit its column (a writer's bug, or a results file from elsewhere)."""


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType
    description: str
    unit: str = ""
    scope: Scope = "run"
    role: Role = "setting"
    # Every results file has it: what the reports place a row by.
    required: bool = False

    def parse(self, text: str | None, where: str = "") -> Any:
        """The typed value of a CSV field (None for an empty one, and for a float's 'nan');
        RowSchemaError naming `where`, the column and what was expected."""
        if text is None:
            return None
        s = text.strip()
        if s == "" or (self.type in ("int", "float") and s.lower() in ("nan", "none")):
            return None
        if self.type == "str":
            return text
        if self.type == "json":
            try:
                return json.loads(s)
            except json.JSONDecodeError:
                raise RowSchemaError(f"{where}: column {self.name!r} = {text!r}, expected JSON") from None
        try:
            x = float(s)
        except ValueError:
            raise RowSchemaError(
                f"{where}: column {self.name!r} = {text!r}, expected "
                f"{'an integer' if self.type == 'int' else 'a number'} or empty"
            ) from None
        if self.type == "float":
            return x
        if not math.isfinite(x) or not x.is_integer():
            raise RowSchemaError(f"{where}: column {self.name!r} = {text!r}, expected an integer or empty")
        return int(x)

    def format(self, value: Any) -> str:
        """The CSV field of a value (None: empty); RowSchemaError when it is not of this type."""
        if value is None or (isinstance(value, str) and value == "" and self.type != "str"):
            return ""  # missing (an empty field read back from a file is missing too)
        if self.type == "json":
            if isinstance(value, str):
                try:
                    json.loads(value)
                except json.JSONDecodeError:
                    raise RowSchemaError(f"column {self.name!r}: {value!r} is not JSON") from None
                return value
            return canonical_json(value)
        if self.type == "str":
            if not isinstance(value, str):
                raise RowSchemaError(f"column {self.name!r}: expected a string, got {value!r}")
            return value
        if isinstance(value, str):  # a field as read back from a results file: kept as written
            self.parse(value, "a text value")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RowSchemaError(f"column {self.name!r}: expected a {self.type}, got {value!r}")
        if self.type == "int":
            if isinstance(value, float) and not value.is_integer():
                raise RowSchemaError(f"column {self.name!r}: expected an integer, got {value!r}")
            return str(int(value))
        return repr(float(value)) if isinstance(value, float) else str(value)


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces: equal settings give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _c(name: str, type: ColumnType, description: str, **kw: Any) -> Column:
    return Column(name, type, description, **kw)


# A list, so that a test (or a fork) that appends a column reaches every reader at once.
SCHEMA: list[Column] = [
    _c("run_id", "str", "`<name>-<config_hash>`: one run", role="id", required=True),
    _c("config_hash", "str", "12 hex digits of what the run selects and trains", role="id"),
    _c("name", "str", "the config's name (the run folder's parent)", role="id"),
    _c("method", "str", "the selector (selection.method)", required=True),
    _c("selection_params", "json", "selection.params in their canonical (typed, defaulted) form"),
    _c("allocator", "str", "the allocator (allocation.method)"),
    _c("allocation_params", "json", "allocation.params in their canonical form"),
    _c("weight_mode", "str", "allocation.weight_mode: none or rank"),
    _c("ratio", "float", "CluSTER's r as a percentage (50 = r 0.5); empty where none", unit="%"),
    _c("kept_fraction", "float", "unique kept examples / pool size", unit="fraction"),
    _c("n_selected", "int", "kept examples (with repeats, where a selector samples with replacement)"),
    _c("n_pool", "int", "examples in the training pool"),
    _c(
        "matched",
        "json",
        "how the budget was matched in compute (match_compute_of): of (the run), run_id, costs "
        "(measured or planned), target_device_s, kept, ...; empty for every other run",
    ),
    _c("model", "str", "model.name_or_path"),
    _c("dataset", "str", "the data sources' stems joined by '+'"),
    _c("world_size", "int", "data-parallel workers (= CluSTER's K)", unit="workers"),
    _c("seed", "int", "the config's seed", required=True),
    _c("selection_seed", "int", "the seed of select and schedule (seed where unset)"),
    _c("training_seed", "int", "the seed of the schedule's deal and the trainer (seed where unset)"),
    _c("eval_settings", "json", "the eval settings the scores were made with"),
    _c(
        "eval_id",
        "str",
        "the evaluation's identity: the eval_hash of the run's eval stage, or of one `cluster-repro "
        "eval` (its folder <run>/evals/<eval_id>/); empty for diagnostic rows",
        scope="row",
        role="measure",
    ),
    _c(
        "written_by",
        "str",
        "results (the run's results stage) or eval (a `cluster-repro eval` of it)",
        role="provenance",
    ),
    _c(
        "eval_protocol",
        "str",
        "how the benchmark was scored (lm-eval, evalplus; docs/benchmarks.md); empty for rows that "
        "are no benchmark's",
        scope="row",
        role="measure",
    ),
    _c(
        "benchmark",
        "str",
        "what was measured: a benchmark, heldout, demo/<c>, or a diagnostic (cost/, cluster/, worker/)",
        scope="row",
        role="measure",
        required=True,
    ),
    _c(
        "metric",
        "str",
        "the benchmark's metric (missing: its data was not found)",
        scope="row",
        role="measure",
        required=True,
    ),
    _c(
        "value",
        "float",
        "the metric's value (a fraction for scores; raw for loss and perplexity)",
        scope="row",
        role="measure",
        required=True,
    ),
    _c("stderr", "float", "its standard error, where known", scope="row", role="measure"),
    _c("n", "int", "items scored (diagnostics: steps)", scope="row", role="measure"),
    _c("selection_s", "float", "select + schedule, every attempt", unit="s", role="cost"),
    _c("train_s", "float", "the training loop, slowest worker, every attempt", unit="s", role="cost"),
    _c("eval_s", "float", "the eval stage", unit="s", role="cost"),
    _c("end_to_end_s", "float", "pool + selection + training + eval", unit="s", role="cost"),
    _c("tokens_per_s", "float", "trained tokens / train_s", unit="tokens/s", role="cost"),
    _c(
        "allreduce_wait_share",
        "float",
        "measured share of step time waiting at the all-reduce (empty under fsdp)",
        unit="fraction",
        role="cost",
    ),
    _c(
        "predicted_idle_share",
        "float",
        "the wait's prediction from the schedule's token counts",
        unit="fraction",
        role="cost",
    ),
    _c("peak_mem_mb", "float", "peak memory of selection or training, the larger", unit="MiB", role="cost"),
    _c("status", "str", "ok, or diverged (non-finite loss or gradients)", role="outcome"),
    _c("attempts", "int", "starts of the run until it finished (1: never interrupted)", role="outcome"),
    _c("resumed_from_step", "int", "the step its training resumed from (0: none)", role="outcome"),
    _c("git_sha", "str", "this project's commit ('+dirty' with local changes)", role="provenance"),
    _c(
        "versions",
        "json",
        "package versions; benchmark rows add the lm-eval task, its version, source and settings",
        role="provenance",
    ),
    _c("hardware", "str", "the device the run trained on", role="provenance"),
    _c("timestamp", "str", "when the rows were written (UTC, ISO 8601)", role="provenance"),
]

BY_NAME: dict[str, Column] = {c.name: c for c in SCHEMA}
COLUMNS: list[str] = [c.name for c in SCHEMA]


def add_column(column: Column) -> None:
    """Append a column to the schema in place (every module's COLUMNS is this one list)."""
    if column.name in BY_NAME:
        raise ValueError(f"column {column.name!r} is in the schema already")
    SCHEMA.append(column)
    BY_NAME[column.name] = column
    COLUMNS.append(column.name)


def remove_column(name: str) -> None:
    """Undo add_column (tests)."""
    col = BY_NAME.pop(name)
    SCHEMA.remove(col)
    COLUMNS.remove(name)


REQUIRED_COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA if c.required)


def columns(role: Role | None = None, scope: Scope | None = None) -> list[Column]:
    """The schema's columns, in order, of one role and/or scope."""
    return [c for c in SCHEMA if (role is None or c.role == role) and (scope is None or c.scope == scope)]


def parse_row(row: dict[str, str], where: str = "") -> dict[str, Any]:
    """A CSV row's typed values, by the schema (columns it does not know stay text); RowSchemaError
    naming `where` and the column for a value of the wrong type."""
    return {k: (BY_NAME[k].parse(v, where) if k in BY_NAME else v) for k, v in row.items()}


def markdown_table() -> str:
    """The column table of docs/reports.md (tests/test_results.py keeps the doc equal)."""
    lines = ["| column | type | unit | scope | role | meaning |", "|---|---|---|---|---|---|"]
    for c in SCHEMA:
        req = " (required)" if c.required else ""
        lines.append(f"| `{c.name}` | {c.type} | {c.unit} | {c.scope} | {c.role} | {c.description}{req} |")
    return "\n".join(lines) + "\n"
