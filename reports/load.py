"""Read the results store into runs and cells: what every table and figure is built from.
The Run record and the benchmark-name helpers are in reports/runs.py (re-exported here).

Input: the tidy result rows (repro/core/results.py) — every `results.part.csv` under a results
directory, or one merged CSV — and, where a row's run folder `<root>/<name>/<config_hash>/` is
present, its per-item scores (`eval_samples.jsonl`), used only to pair bootstrap intervals on items,
and its per-step token sums per worker (`step_tokens.json`), used only by the step-tokens figure
and, for the analyses, its selection.json and pool.jsonl (`load_kept`).
Every file is checked before it is read (part files against their checksum sidecar, see
docs/files.md): a damaged one stops the report unless --allow-damaged leaves it out, by name.

A *run* is one `run_id` (one config, one seed). A *cell* is what the tables show as one line: the
runs that differ only in their seed (same dataset, model, method, selection params, ratio,
allocator and its params, weighting, world size and, for budget-taking baselines, the budget). A
baseline run at
exactly a CluSTER run's kept count (same seed, dataset, model, workers) is placed "at r = ..." of
that CluSTER run, so random runs matched per seed land in one cell even when CluSTER's kept count
differs a little between seeds.

Row kinds, told apart by the benchmark name: quality scores (anything else), and the diagnostic
rows that repro/pipeline.py `diagnostic_rows` writes: `cost/<step>`, `cluster/<c>`,
`cluster/agreement`, `worker/<k>`. A row with metric `missing` says a benchmark could not be run:
its cells show as missing, never as zero. A run whose rows say status `diverged` (its training
loss or gradients became non-finite; one row `train`/`diverged` holds the step) has no scores:
its quality cells show "diverged".
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# The run record and the benchmark-name helpers live in reports/runs.py; their names stay here.
from reports.runs import (
    DOMAINS,
    RAW_METRICS,
    REQUIRED,
    ReportInputError,
    Run,
    cost_columns,
    domain_of,
    is_diagnostic,
    norm_benchmark,
    split_protocol,
)
from repro.core import schema
from repro.core.fingerprints import verify_run_file
from repro.core.results import PART_NAME
from repro.core.types import RunFileError, read_selection

__all__ = [
    "DOMAINS",
    "RAW_METRICS",
    "REQUIRED",
    "Cell",
    "Kept",
    "ReportInputError",
    "Run",
    "assign_budgets",
    "build_runs",
    "cell_key",
    "cost_columns",
    "domain_of",
    "find_result_files",
    "group_cells",
    "input_digest",
    "is_diagnostic",
    "load_items",
    "load_kept",
    "load_step_tokens",
    "norm_benchmark",
    "place_base_runs",
    "read_jsonl",
    "read_result_rows",
    "read_results",
    "schema_notes",
    "selection_label",
    "split_protocol",
]


def _parse(r: dict[str, str], where: str) -> dict[str, Any]:
    """The row's values typed by the schema (repro/core/schema.py); a value of the wrong type is a
    ReportInputError naming the file, row and column."""
    try:
        return schema.parse_row(r, where)
    except schema.RowSchemaError as e:
        raise ReportInputError(str(e)) from None


def find_result_files(results: Path) -> tuple[list[Path], Path]:
    """The CSV files to read and the root that run folders are relative to.

    A file: that file (root: its folder). A folder: every results.part.csv under it (what the
    runs wrote), or else its results.csv.
    """
    results = Path(results)
    if results.is_file():
        return [results], results.parent
    if not results.is_dir():
        raise FileNotFoundError(
            f"results {results}: no such file or folder (give the output_dir "
            "the runs wrote to, or a results.csv)"
        )
    parts = sorted(results.rglob(PART_NAME))
    if parts:
        return parts, results
    merged = results / "results.csv"
    if merged.is_file():
        return [merged], results
    raise FileNotFoundError(
        f"no {PART_NAME} files and no results.csv under {results}; run an "
        "experiment first (cluster-repro run CONFIG, or cluster-repro demo)"
    )


def read_results(
    files: list[Path], root: Path, allow_damaged: bool = False
) -> tuple[list[tuple[str, dict[str, str]]], list[str]]:
    """Every row with a 'file:line' label for messages, and a note per damaged file skipped.

    Each file is checked first (repro/core/results.py `read_checked`: part files against their
    checksum sidecar; any CSV for a cut header, row or quoted field). A damaged file is a
    ReportInputError naming each, unless `allow_damaged`: then it is left out and named in the
    notes. Identical duplicate rows across files are kept once; two different rows for one
    (run_id, benchmark, metric) are a ReportInputError naming both places.
    """
    from repro.core.results import ConflictingRowsError, damaged_message, read_result_files

    try:
        out, damaged = read_result_files(files, root)
    except ConflictingRowsError as e:
        raise ReportInputError(str(e)) from None
    if damaged and not allow_damaged:
        raise ReportInputError(damaged_message(damaged, allowed=False))
    if not out:
        raise ReportInputError(
            f"no result rows in {', '.join(str(f) for f in files)}"
            + (f" ({len(damaged)} damaged)" if damaged else "")
        )
    return out, [f"skipped damaged results file {d}" for d in damaged]


# Columns the report groups runs into cells and pairs them by (cell_key, assign_budgets): a file
# without one would move its runs to another cell silently, so it is refused (or, with
# --allow-old-schema, read with a migration note). Other missing columns are blanks (one note).
GROUP_COLUMNS = (
    "dataset",
    "model",
    "world_size",
    "selection_params",
    "ratio",
    "n_selected",
    "allocator",
    "allocation_params",
    "weight_mode",
)


def schema_notes(
    rows: list[tuple[str, dict[str, str]]], allow_old_schema: bool = False
) -> tuple[list[str], list[str]]:
    """(warnings, notes) about files written before some columns existed. A file lacking a
    GROUP_COLUMNS column is a ReportInputError naming the file, the columns and the fix, unless
    `allow_old_schema` (then a warning, the migration note); optional columns missing anywhere
    give one note."""
    from repro.core.results import COLUMNS

    headers: dict[str, set[str]] = {}
    for label, r in rows:
        headers.setdefault(label.rsplit(":", 1)[0], set(r))
    old = {f: [c for c in GROUP_COLUMNS if c not in h] for f, h in headers.items()}
    old = {f: cols for f, cols in old.items() if cols}
    warnings_: list[str] = []
    if old and not allow_old_schema:
        lines = [f"  {f}: lacks {', '.join(cols)}" for f, cols in sorted(old.items())]
        raise ReportInputError(
            f"{len(old)} results file(s) lack columns the report groups and pairs runs by (written "
            "by an older version of the suite); their runs would land in the wrong cells:\n"
            + "\n".join(lines)
            + "\nRewrite each run's part: delete its stages/results.json and run it again (only "
            "the results stage reruns), then `cluster-repro results`; or pass --allow-old-schema to "
            "report them as they are (a migration note goes on the index page)"
        )
    for f, cols in sorted(old.items()):
        warnings_.append(
            f"migration: {f} predates the column(s) {', '.join(cols)}; its runs are shown with "
            "those settings unknown (--allow-old-schema), so they are not compared with runs that "
            "state them. Rerun its results stage to place them"
        )
    optional = sorted({c for h in headers.values() for c in COLUMNS if c not in h and c not in GROUP_COLUMNS})
    notes = []
    if optional:
        n = sum(1 for h in headers.values() if any(c not in h for c in optional))
        notes.append(
            f"{n} results file(s) predate the optional column(s) {', '.join(optional)}: shown as "
            "blank (not measured) where they are missing"
        )
    return warnings_, notes


def read_result_rows(
    files: list[Path], root: Path, allow_damaged: bool = False
) -> list[tuple[str, dict[str, str]]]:
    """`read_results` without the notes."""
    return read_results(files, root, allow_damaged)[0]


def input_digest(rows: list[tuple[str, dict[str, str]]]) -> str:
    """A short hash of the rows' content (not their paths), shown on the index page."""
    h = hashlib.sha256()
    for _, r in sorted(rows, key=lambda x: (x[1]["run_id"], x[1]["benchmark"], x[1]["metric"])):
        h.update(json.dumps(r, sort_keys=True).encode())
    return h.hexdigest()[:12]


def _mapping(v: Any, where: str, col: str) -> dict[str, Any]:
    """A JSON column's value that must be a mapping (empty: {})."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ReportInputError(f"{where}: column {col!r} is {v!r}, expected a JSON mapping")
    return v


def build_runs(rows: list[tuple[str, dict[str, str]]], root: Path | None) -> list[Run]:
    runs: dict[str, Run] = {}
    for where, raw in rows:
        r = _parse(raw, where)  # every row is checked, not only a run's first
        rid = r["run_id"]
        if not rid:
            raise ReportInputError(f"{where}: empty run_id")
        if rid not in runs:
            versions = _mapping(r.get("versions"), where, "versions")
            seed = r.get("seed")
            runs[rid] = Run(
                run_id=rid,
                config_hash=r.get("config_hash") or "",
                name=r.get("name") or "",
                dataset=r.get("dataset") or "",
                model=r.get("model") or "",
                method=r["method"],
                params=_mapping(r.get("selection_params"), where, "selection_params"),
                allocator=r.get("allocator") or "",
                weight_mode=r.get("weight_mode") or "",
                ratio=r.get("ratio"),
                world_size=r.get("world_size"),
                seed=0 if seed is None else seed,
                kept_fraction=r.get("kept_fraction"),
                n_selected=r.get("n_selected"),
                n_pool=r.get("n_pool"),
                costs={c: r.get(c) for c in cost_columns()},
                lm_eval=versions.get("lm_eval"),
                versions=versions,
                git_sha=r.get("git_sha") or "",
                attempts=r.get("attempts"),
                resumed_from_step=r.get("resumed_from_step"),
                alloc_params=_mapping(r.get("allocation_params"), where, "allocation_params"),
                columns={c.name: r.get(c.name) for c in schema.columns(scope="run")},
            )
            run = runs[rid]
            for col in ("selection_seed", "training_seed"):
                v = r.get(col)
                setattr(run, col, run.seed if v is None else v)
        run = runs[rid]
        b, m = r["benchmark"], r["metric"]
        if r.get("eval_protocol") not in (None, "", "lm-eval") and not is_diagnostic(b):
            b = f"{b}@{r['eval_protocol']}"  # never averaged with another protocol's rows
        if r.get("status") == "diverged":
            run.status = "diverged"
        if m == "diverged":
            run.diverged_step = None if r["value"] is None else int(r["value"])
            continue
        if not is_diagnostic(b):
            kind = _mapping(r.get("versions"), where, "versions").get("benchmark_kind")
            if kind:
                run.kinds[b] = run.kinds[split_protocol(b)[0]] = str(kind)
        if m == "missing":
            run.missing.add(b)
            continue
        value = r["value"]
        n = r.get("n")
        if is_diagnostic(b):
            if value is not None:
                run.diag[(b, m)] = value
                if n is not None:
                    run.diag_n[(b, m)] = n
        else:
            run.scores[(b, m)] = value
            if n is not None:
                run.n_items[b] = n
    out = sorted(runs.values(), key=lambda x: x.run_id)
    if root is not None:
        for run in out:
            run.items = load_items(root / run.name / run.config_hash)
            run.step_tokens = load_step_tokens(root / run.name / run.config_hash)
    return out


def load_step_tokens(run_dir: Path) -> list[list[int]] | None:
    """Per optimizer step, each worker's tokens (the schedule stage's step_tokens.json), or None
    when the run folder or file is not there."""
    path = run_dir / "step_tokens.json"
    if not path.is_file():
        return None
    try:
        steps = json.loads(path.read_text(encoding="utf-8"))["step_tokens"]
        return [[int(x) for x in row] for row in steps]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ReportInputError(
            f"{path}: expected JSON with step_tokens, a list of per-worker token lists ({e})"
        ) from None


def read_jsonl(path: Path, expected: str, read: Any) -> list[Any]:
    """read(row) for every non-blank line of a JSONL file; a line that is no JSON, or that `read`
    cannot take (a missing key, a wrong type), is a ReportInputError naming the file and line and
    what was `expected`."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                out.append(read(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ReportInputError(f"{path}:{i}: expected {expected} ({e})") from None
    return out


def load_items(run_dir: Path) -> dict[str, dict[str, float]]:
    """Per-item scores of one run: eval_samples.jsonl rows with `id`, `score` and `benchmark` (or
    the demo's `category`, read as benchmark demo/<category>; every demo item also counts for
    demo/overall). Empty when the run folder or file is not there."""
    path = run_dir / "eval_samples.jsonl"
    if not path.is_file():
        return {}
    items: dict[str, dict[str, float]] = {}
    rows = read_jsonl(
        path,
        "JSON with id, score and benchmark or category",
        lambda d: (d.get("benchmark") or f"demo/{d['category']}", str(d["id"]), float(d["score"])),
    )
    for bench, iid, score in rows:
        items.setdefault(bench, {})[iid] = score
        if bench.startswith("demo/"):
            items.setdefault("demo/overall", {})[iid] = score
    return items


# ----------------------------------------------------------------------------- cells


@dataclass
class Cell:
    """The runs of one configuration, one per seed."""

    key: tuple
    runs: list[Run]

    @property
    def first(self) -> Run:
        return self.runs[0]

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]

    def label(self) -> str:
        """method, the paper's r, any non-default selection params, and the budget of baselines."""
        r = self.first
        out = r.method
        if r.ratio is not None:
            out += f" r={r.ratio / 100:g}"
        extra = {k: v for k, v in sorted(r.params.items()) if k != "ratio"}
        extra.update(sorted(r.alloc_params.items()))
        if extra:
            out += " (" + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")"
        if r.budget:
            out += f" @{r.budget}"
        return out


def _params_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def assign_budgets(runs: list[Run]) -> None:
    """Budget label of each baseline run without a ratio (other than full): 'r=0.5' when its kept
    count equals a ratio run's (same dataset, model, workers, seed), else 'n=<kept>'."""
    by_count: dict[tuple, list[float]] = {}
    for r in runs:
        if r.ratio is not None and r.n_selected is not None:
            by_count.setdefault((r.dataset, r.model, r.world_size, r.seed, r.n_selected), []).append(r.ratio)
    for r in runs:
        if r.ratio is not None or r.method in ("full", "base"):
            r.budget = ""
            continue
        ratios = by_count.get((r.dataset, r.model, r.world_size, r.seed, r.n_selected))
        r.budget = f"r={min(ratios) / 100:g}" if ratios else f"n={r.n_selected}"


METHOD_ORDER = {"base": -1, "full": 0, "cluster": 1, "random": 9}


def place_base_runs(runs: list[Run]) -> list[Run]:
    """Put each base-model evaluation into the settings it is the reference of.

    `cluster-repro eval --model M` writes rows with method 'base' and no dataset: M before any
    fine-tuning. Such a run becomes a 'base' line in every setting (dataset, model, workers) that
    fine-tunes M, with the scores of the benchmarks that setting's runs report on the same number
    of items (so a full-set base score never sits beside scores on a `limit`). A base run that
    no setting takes stays a line of its own.
    """
    settings: dict[tuple, dict[str, set[int | None]]] = {}
    for r in runs:
        if r.method == "base" and not r.dataset:
            continue
        benches = settings.setdefault((r.dataset, r.model, r.world_size), {})
        for b, _m in r.scores:
            benches.setdefault(b, set()).add(r.n_items.get(b))
    out = []
    for r in runs:
        if r.method != "base" or r.dataset:
            out.append(r)
            continue
        placed = False
        for (dataset, model, workers), benches in sorted(settings.items(), key=str):
            if model != r.model:
                continue
            keep = {
                k: v for k, v in r.scores.items() if k[0] in benches and r.n_items.get(k[0]) in benches[k[0]]
            }
            if keep:
                out.append(
                    replace(
                        r,
                        dataset=dataset,
                        world_size=workers,
                        scores=keep,
                        missing=set(),
                        run_id=f"{r.run_id}@{dataset}/{workers}",
                    )
                )
                placed = True
        if not placed:
            out.append(r)
    return out


def cell_key(r: Run) -> tuple:
    return (
        r.dataset,
        r.model,
        r.world_size or 0,
        METHOD_ORDER.get(r.method, 5),
        r.method,
        -(r.ratio or 0),
        _params_key(r.params),
        r.budget,
        r.allocator,
        _params_key(r.alloc_params),
        r.weight_mode,
    )


def group_cells(runs: list[Run]) -> list[Cell]:
    """Cells in a fixed order: dataset, model, workers, the base model, full, CluSTER by ratio,
    random last."""
    runs = place_base_runs(runs)
    assign_budgets(runs)
    cells: dict[tuple, list[Run]] = {}
    for r in runs:
        cells.setdefault(cell_key(r), []).append(r)
    out = []
    for key in sorted(cells):  # every key position has one type, so tuples compare
        out.append(Cell(key, sorted(cells[key], key=lambda r: (r.seed, r.run_id))))
    return out


# ----------------------------------------------------------------------------- selections (analyses)


@dataclass
class Kept:
    """One run's selection, read from its run folder."""

    run: Run
    label: str
    ids: list[str]
    scores: dict[str, float] = field(default_factory=dict)
    clusters: dict[str, int] = field(default_factory=dict)
    pool_categories: dict[str, str | None] = field(default_factory=dict)
    cluster_sizes: list[int] | None = None

    @property
    def kept(self) -> set[str]:
        return set(self.ids)

    @property
    def pool_key(self) -> tuple:
        r = self.run
        return (r.dataset, r.model, r.seed)


def selection_label(r: Run) -> str:
    """What tells one selection from another: the method, its params (r= for CluSTER's ratio),
    the world size for CluSTER (its clusters are dealt per worker) and the selection seed where
    it is not the run's seed."""
    out = r.method
    if r.ratio is not None:
        out += f" r={r.ratio / 100:g}"
    extra = {k: v for k, v in sorted(r.params.items()) if k != "ratio"}
    if extra:
        out += " (" + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")"
    if r.method == "cluster" and r.world_size:
        out += f" K={r.world_size}"
    if r.selection_seed is not None and r.selection_seed != r.seed:
        out += f" sel-seed={r.selection_seed}"
    return out


def _read_pool(path: Path) -> dict[str, str | None]:
    rows = read_jsonl(path, "a JSON example with an id", lambda d: (str(d["id"]), d.get("category")))
    return dict(rows)


def load_kept(runs: list[Run], root: Path | None) -> list[Kept]:
    """The selections of the runs whose folders hold selection.json and pool.jsonl (not full
    data, not the base model), one per (pool, label, kept count): a run that repeats another's
    selection (another training seed, allocator or world size of the same selection) is left
    out."""
    if root is None:
        return []
    out: list[Kept] = []
    seen: set[tuple] = set()
    pools: dict[Path, dict[str, str | None]] = {}
    for r in sorted(runs, key=lambda x: x.run_id):
        if r.method in ("full", "base"):  # a diverged run's selection still counts
            continue
        d = root / r.name / r.config_hash
        sel_path, pool_path = d / "selection.json", d / "pool.jsonl"
        if not sel_path.is_file() or not pool_path.is_file():
            continue
        label = selection_label(r)
        key = (r.dataset, r.model, r.seed, label, r.n_selected)
        if key in seen:
            continue
        seen.add(key)
        try:
            for name in ("selection.json", "pool.jsonl"):  # as their stages wrote them
                verify_run_file(d, name)
            sel = read_selection(sel_path)
        except RunFileError as e:
            raise ReportInputError(str(e)) from None
        ids = sel.ids
        scores = (
            {i: float(s) for i, s in zip(ids, sel.scores) if s is not None and math.isfinite(float(s))}
            if sel.scores
            else {}
        )
        clusters = {i: int(c) for i, c in zip(ids, sel.clusters)} if sel.clusters else {}
        sizes = sel.diagnostics.cluster_sizes_before_cap or sel.info.get("cluster_sizes")
        if pool_path not in pools:
            pools[pool_path] = _read_pool(pool_path)
        out.append(
            Kept(
                run=r,
                label=label,
                ids=ids,
                scores=scores,
                clusters=clusters,
                pool_categories=pools[pool_path],
                cluster_sizes=[int(x) for x in sizes] if isinstance(sizes, list) else None,
            )
        )
    return out
