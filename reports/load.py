"""Read the results store into runs and cells: what every table and figure is built from.
The Run record and the benchmark-name helpers are in reports/runs.py.

Input: the results store (repro/core/store.py): every run folder under a results directory (its
stored config, status and result rows, its `cluster-repro eval` folders), or one merged set; and,
where a run's folder is present, its per-item scores (`eval_samples.jsonl`), used only to form
paired differences from items, its per-step token sums per worker (`step_tokens.json`), used only by
the step-tokens figure, and, for the analyses, its selection.json and pool.jsonl (`load_kept`).
Every file is checked before it is read (checksums and schema version; docs/files.md).

A *run* is one run folder (one config, one seed), its settings taken from its stored config. A
*cell* is what the tables show as one line: the runs whose stored configs differ only in their
seeds (and, for a run matched to another's kept count or compute, in the count that match gave).
Its budget label comes from the config too: a matched run's record (`selection.matched`) places
random at CluSTER's kept count "at r = ..." of that CluSTER run, whatever count each seed got.

Measurements: a run's score for a benchmark comes from one evaluation (its eval_id): the run's
own eval stage where it has that benchmark, else the evaluation with the most items (then the
newest). A run scored under several protocols keeps one key per protocol
(`<benchmark>@<protocol>`, never averaged with another protocol). `Run.variants` records the
settings each score was made with (limit, items, shots, generation limit, source, template), so
scores made differently are never paired or averaged as if alike (reports/values.py).

Row kinds, told apart by the benchmark name: quality scores (anything else), and the diagnostic
rows that repro/run_rows.py `diagnostic_rows` writes: `cost/<step>`, `cluster/<c>`,
`cluster/agreement`, `worker/<k>`. A row with metric `missing` says a benchmark could not be run:
its cells show as missing, never as zero. A diverged run (status from its stage markers) has no
scores: its quality cells show "diverged". Failed and incomplete runs have no results: the report
lists them (`Loaded.unfinished`), and no table counts them.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from reports.runs import (
    SHARED_FEATURES,
    ReportInputError,
    Run,
    cost_columns,
    is_diagnostic,
    split_protocol,
)
from repro.core import schema
from repro.core.errors import UserError
from repro.core.fingerprints import verify_run_file
from repro.core.store import DIVERGED, DONE, MODEL_EVAL, Store, StoredRun, open_store
from repro.core.types import RunFileError, read_selection

__all__ = [
    "Cell",
    "Kept",
    "Loaded",
    "assign_budgets",
    "build_runs",
    "cell_key",
    "group_cells",
    "input_digest",
    "load",
    "load_items",
    "load_kept",
    "load_step_tokens",
    "place_base_runs",
    "read_jsonl",
    "selection_label",
]


def _parse(r: dict[str, str], where: str) -> dict[str, Any]:
    """The row's values typed by the schema (repro/core/schema.py); a value of the wrong type is a
    ReportInputError naming the file, row and column."""
    try:
        return schema.parse_row(r, where)
    except schema.RowSchemaError as e:
        raise ReportInputError(str(e)) from None


@dataclass
class Loaded:
    """A store read for the reports: its runs with results (done or diverged), the runs without
    (failed, incomplete: listed, never counted), notes for the index page, and the store."""

    store: Store
    runs: list[Run]
    unfinished: list[StoredRun]
    notes: list[str]


def load(results: Path | str, allow_damaged: bool = False, run_ids: set[str] | None = None) -> Loaded:
    """Open the store at `results` (a folder or a merged CSV) and build its runs. Every error of
    the store (a damaged or older file, a row in the wrong folder) is a ReportInputError naming
    the file and the fix."""
    try:
        store = open_store(Path(results), allow_damaged=allow_damaged).only(run_ids)
    except UserError as e:
        raise ReportInputError(str(e)) from None
    runs, notes = build_runs(store)
    unfinished = [r for r in store.runs.values() if r.status.state not in (DONE, DIVERGED)]
    if unfinished:
        notes.append(
            f"{len(unfinished)} run(s) have no results yet and are in no table: "
            + "; ".join(
                f"{r.run_id} ({r.status.describe()})" for r in sorted(unfinished, key=lambda r: r.run_id)
            )
        )
    notes = [f"skipped damaged results file {d}" for d in store.damaged] + notes
    return Loaded(store, runs, unfinished, notes)


def input_digest(runs: list[Run]) -> str:
    """A short hash of the runs' rows (not their paths), shown on the index page."""
    h = hashlib.sha256()
    for r in sorted(runs, key=lambda x: x.run_id):
        for row in sorted(r.rows, key=lambda x: (x.get("eval_id") or "", x["benchmark"], x["metric"])):
            h.update(json.dumps(row, sort_keys=True).encode())
    return h.hexdigest()[:12]


def _mapping(v: Any, where: str, col: str) -> dict[str, Any]:
    """A JSON column's value that must be a mapping (empty: {})."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ReportInputError(f"{where}: column {col!r} is {v!r}, expected a JSON mapping")
    return v


# Config keys that are not part of a run's cell: where it lives and what it is called, how it
# is evaluated and launched, its seeds, and the keys its cell label shows itself (method, params,
# budget, allocation, world size, model and data names).
_NOT_IN_REST = (
    "name",
    "output_dir",
    "data_dir",
    "launch",
    "eval",
    "train.report_to",
    "seed",
    "selection_seed",
    "training_seed",
    "world_size",
    "selection.method",
    "selection.params",
    "selection.n",
    "selection.fraction",
    "selection.matched",
    "allocation",
    "model.name_or_path",
)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(d, list):
        out = {}
        for i, v in enumerate(d):
            out.update(_flat(v, f"{prefix[:-1]}[{i}]."))
        return out or {prefix[:-1]: []}
    return {prefix[:-1]: d}


def _rest(config: dict[str, Any]) -> dict[str, Any]:
    """The config's settings outside the cell label, flattened (`train.lr`, ...)."""
    flat = _flat(config)
    return {
        k: v
        for k, v in flat.items()
        if not any(k == x or k.startswith(x + ".") or k.startswith(x + "[") for x in _NOT_IN_REST)
    }


def _settings_of(stored: StoredRun) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the run's settings as result columns, the rest of its config flattened, its config as
    the mapping the run ran with) from the stored config (kind run) or its eval record."""
    if stored.kind == MODEL_EVAL:
        rec = stored.record
        method = rec.get("method") or "base"
        return {"method": method, "model": rec.get("model") or "", "name": rec.get("name")}, {}, {}
    where = stored.folder / "run.json" if stored.folder else f"the stored config of {stored.run_id}"
    try:
        made, config_hash = _settings_of_config(json.dumps(stored.config, sort_keys=True))
    except UserError as e:
        raise ReportInputError(f"{where}: the run's stored config does not load here: {e}") from None
    if config_hash != stored.config_hash or stored.run_id != f"{made[0]['name']}-{config_hash}":
        raise ReportInputError(
            f"{where}: its config hashes to {made[0]['name']}-{config_hash}, but the record says run "
            f"{stored.run_id} (config_hash {stored.config_hash}): the record was changed after the "
            "run wrote it. Rerun the run, or restore its run.json"
        )
    return copy.deepcopy(made)


@functools.lru_cache(maxsize=4096)
def _settings_of_config(
    config_json: str,
) -> tuple[tuple[dict[str, Any], dict[str, Any], dict[str, Any]], str]:
    """`_settings_of` for one config (its canonical JSON), and its config hash: built and
    validated once per process, since building a config is most of a store's reading time."""
    from repro.core.config.load import from_dict
    from repro.core.store import run_settings

    cfg = from_dict(json.loads(config_json), source="the stored config")
    config = cfg.to_dict()
    return (run_settings(cfg), _rest(config), config), cfg.hash()


def _variant(r: dict[str, Any]) -> str:
    """The settings a score was made with, as one canonical string: the eval settings its row's
    versions state, and the number of items it was scored on (the same settings on another
    copy of the data would score another number)."""
    v = r.get("versions") if isinstance(r.get("versions"), dict) else {}
    keys = ("eval_source", "eval_limit", "eval_items", "num_fewshot", "eval_max_gen_toks", "eval_template")
    keys += ("evalplus_dataset", "eval_data_version", "eval_data_sha256")
    said = {k: v.get(k) for k in keys if v.get(k) is not None}
    return json.dumps({**said, "n": r.get("n")}, sort_keys=True)


def _pick(candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """The measurement a run's score is taken from, among its evaluations of one benchmark and
    metric: its own eval stage's, else the one with the most items, then the newest."""
    own = [c for c in candidates if c.get("written_by") == "results"]
    if own:
        return own[0]
    return max(candidates, key=lambda c: (c.get("n") or 0, c.get("timestamp") or "", c.get("eval_id") or ""))


def build_runs(store: Store) -> tuple[list[Run], list[str]]:
    """The runs of the store that have results (done or diverged), each with its settings from its
    stored config, its costs from its own results stage, and one measurement per benchmark and
    metric; and notes (runs evaluated more than once for a benchmark: which one is used)."""
    runs: list[Run] = []
    notes: list[str] = []
    for stored in sorted(store.runs.values(), key=lambda r: r.run_id):
        if stored.status.state not in (DONE, DIVERGED):
            continue
        settings, rest, config = _settings_of(stored)
        typed = [(w, _parse(raw, w)) for w, raw in stored.rows]
        own = [(w, r) for w, r in typed if stored.kind == MODEL_EVAL or r.get("written_by") == "results"]
        if not own:
            raise ReportInputError(
                f"run {stored.run_id} ({stored.folder}) is {stored.status.state} but has no rows of its "
                "own results stage; delete its stages/results.json and run it again"
            )
        first = own[0][1]
        where = own[0][0]
        versions = _mapping(first.get("versions"), where, "versions")
        seed = settings.get("seed")
        run = Run(
            run_id=stored.run_id,
            config_hash=stored.config_hash,
            name=stored.name or str(settings.get("name") or ""),
            dataset=settings.get("dataset") or "",
            model=settings.get("model") or "",
            method=settings["method"],
            params=_mapping(settings.get("selection_params"), where, "selection_params"),
            allocator=settings.get("allocator") or "",
            weight_mode=settings.get("weight_mode") or "",
            ratio=settings.get("ratio"),
            world_size=settings.get("world_size"),
            seed=0 if seed is None else seed,
            kept_fraction=first.get("kept_fraction"),
            n_selected=first.get("n_selected"),
            n_pool=first.get("n_pool"),
            costs={c: first.get(c) for c in cost_columns()},
            lm_eval=versions.get("lm_eval"),
            versions=versions,
            git_sha=first.get("git_sha") or "",
            attempts=first.get("attempts"),
            resumed_from_step=first.get("resumed_from_step"),
            alloc_params=_mapping(settings.get("allocation_params"), where, "allocation_params"),
            columns={
                **{c.name: first.get(c.name) for c in schema.columns(scope="run")},
                **{k: v for k, v in settings.items() if k in schema.BY_NAME},
            },
        )
        run.selection_seed = settings.get("selection_seed", run.seed)
        run.training_seed = settings.get("training_seed", run.seed)
        run.matched = settings.get("matched")
        run.rest = rest
        run.config = config
        run.folder = stored.folder
        run.rows = [raw for _, raw in stored.rows]
        if stored.status.state == DIVERGED:
            run.status = "diverged"
            run.diverged_step = stored.status.diverged_step
        _measurements(run, typed, notes)
        count_reused_features(run)
        if stored.folder is not None:
            run.items = load_items(stored.folder)
            run.step_tokens = load_step_tokens(stored.folder)
        runs.append(run)
    return runs, notes


def count_reused_features(run: Run) -> None:
    """Add a feature pass the run reused (`SHARED_FEATURES`: a shared features job's
    device-seconds) to its `selection_s` and `end_to_end_s`, as the seconds it would have taken
    on the run's own workers (device-seconds / world size): the run's rows leave it out, since
    its select stage did not compute it, but its selection needed it. Compute matching counts
    it the same way (repro/experiments/compute.py)."""
    shared = float(run.diag.get(SHARED_FEATURES) or 0.0)
    if shared <= 0 or run.costs.get("selection_s") is None:
        return
    run.reused_features_s = shared / (run.world_size or 1)
    for col in ("selection_s", "end_to_end_s"):
        if run.costs.get(col) is not None:
            run.costs[col] = float(run.costs[col]) + run.reused_features_s  # type: ignore[arg-type]


def _measurements(run: Run, typed: list[tuple[str, dict[str, Any]]], notes: list[str]) -> None:
    """Fill the run's scores, missing benchmarks, diagnostics and kinds from its rows: one
    measurement per (benchmark key, metric) (`_pick`)."""
    candidates: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for where, r in typed:
        b, m = r["benchmark"], r["metric"]
        if r.get("eval_protocol") not in (None, "", "lm-eval") and not is_diagnostic(b):
            b = f"{b}@{r['eval_protocol']}"  # never averaged with another protocol's rows
        if m == "diverged":
            continue
        if is_diagnostic(b):
            if r.get("written_by") == "results":
                if r["value"] is not None:
                    run.diag[(b, m)] = r["value"]
                    if r.get("n") is not None:
                        run.diag_n[(b, m)] = r["n"]
            continue
        if run.status == "diverged":
            continue
        kind = _mapping(r.get("versions"), where, "versions").get("benchmark_kind")
        if kind:
            run.kinds[b] = run.kinds[split_protocol(b)[0]] = str(kind)
        candidates.setdefault((b, m if m != "missing" else "\0missing"), []).append(r)
    measured = {b for (b, m) in candidates if m != "\0missing"}
    for (b, m), cands in sorted(candidates.items()):
        if m == "\0missing":
            if b not in measured:
                run.missing.add(b)
            continue
        chosen = _pick(cands)
        if len({c.get("eval_id") for c in cands}) > 1:
            why = "its own eval stage" if chosen.get("written_by") == "results" else "most items, then newest"
            notes.append(
                f"run {run.run_id}: {b} {m} was evaluated {len(cands)} times (eval ids "
                f"{', '.join(sorted(str(c.get('eval_id')) for c in cands))}); the report uses "
                f"{chosen.get('eval_id')} ({why})"
            )
        run.scores[(b, m)] = chosen["value"]
        run.variants[b] = _variant(chosen)
        said = chosen.get("versions") if isinstance(chosen.get("versions"), dict) else {}
        if said.get("eval_data_version"):  # the benchmark file's version (MBPP+, HumanEval+)
            run.data_versions[b] = f"{said['eval_data_version']} ({said.get('eval_data_tasks')} tasks)"
        run.eval_ids[b] = str(chosen.get("eval_id") or "")
        if chosen.get("n") is not None:
            run.n_items[b] = chosen["n"]


def load_step_tokens(run_dir: Path) -> list[list[int]] | None:
    """Per optimizer step, each worker's tokens (the schedule stage's step_tokens.json), or None
    when the run folder or file is not there."""
    path = run_dir / "step_tokens.json"
    if not path.is_file():
        return None
    try:
        verify_run_file(run_dir, "step_tokens.json")  # as the schedule stage wrote it
    except RunFileError as e:
        raise ReportInputError(str(e)) from None
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
    """Per-item scores of one run: eval_samples.jsonl rows (the items of the benchmarks of
    held-out rows: the demo's) with `id`, `score` and `benchmark` (`<name>/<category>`; every
    item also counts for `<name>/overall`). Empty when the run folder or file is not there."""
    path = run_dir / "eval_samples.jsonl"
    if not path.is_file():
        return {}
    items: dict[str, dict[str, float]] = {}
    rows = read_jsonl(
        path,
        "JSON with id, score and benchmark",
        lambda d: (str(d["benchmark"]), str(d["id"]), float(d["score"])),
    )
    for bench, iid, score in rows:
        items.setdefault(bench, {})[iid] = score
        items.setdefault(f"{bench.partition('/')[0]}/overall", {})[iid] = score
    return items


# ----------------------------------------------------------------------------- cells


@dataclass
class Cell:
    """The runs of one configuration, one per seed."""

    key: tuple
    runs: list[Run]
    # What tells this cell from another of the same label and setting (their configs differ in
    # keys the label does not show): e.g. "train.lr=0.0001"; empty when the label is unique.
    distinct: str = ""

    @property
    def first(self) -> Run:
        return self.runs[0]

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]

    def label(self) -> str:
        """method, the paper's r, any non-default selection params, the budget of baselines, and
        what tells it from a cell of the same label."""
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
        if self.distinct:
            out += f" [{self.distinct}]"
        return out


def _params_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _ratio_label(ratio: float | None) -> str:
    return "" if ratio is None else f"r={ratio / 100:g}"


def assign_budgets(runs: list[Run]) -> None:
    """Budget label of each baseline run without a ratio (other than full and the base model),
    from its config: a run matched to another's kept count is 'r=<its ratio>' (the run it
    matched, by the match record's run id), one matched in compute 'compute of <that run>', and
    any other 'n=<selection.n>' or 'f=<selection.fraction>' as configured."""
    by_id = {r.run_id: r for r in runs}
    for r in runs:
        if r.ratio is not None or r.method in ("full", "base", "adapter", "oracle"):
            r.budget = ""
            continue
        rec = r.matched if isinstance(r.matched, dict) else None
        if rec is not None:
            ref = by_id.get(str(rec.get("run_id")))
            ref_name = (_ratio_label(ref.ratio) if ref is not None else "") or str(rec.get("of"))
            r.budget = f"compute of {ref_name}" if rec.get("by") == "compute" else ref_name
            continue
        sel = (r.config or {}).get("selection") or {}
        if sel.get("n") is not None:
            r.budget = f"n={sel['n']}"
        elif sel.get("fraction") is not None:
            r.budget = f"f={sel['fraction']:g}"
        else:
            r.budget = ""


METHOD_ORDER = {"base": -1, "full": 0, "cluster": 1, "random": 9}


def place_base_runs(runs: list[Run]) -> list[Run]:
    """Put each base-model evaluation into the settings it is the reference of.

    `cluster-repro eval --model M` writes rows with method 'base' and no dataset: M before any
    fine-tuning. Such a run becomes a 'base' line in every setting (dataset, model, workers) that
    fine-tunes M, with the scores of the benchmarks that setting's runs report made the same way
    (the same items and settings: Run.variants), so a full-set base score never sits beside
    scores on a `limit`. A base run that no setting takes stays a line of its own.
    """
    settings: dict[tuple, dict[str, set[str]]] = {}
    for r in runs:
        if r.method == "base" and not r.dataset:
            continue
        benches = settings.setdefault((r.dataset, r.model, r.world_size), {})
        for b, _m in r.scores:
            benches.setdefault(b, set()).add(r.variants.get(b, ""))
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
                k: v
                for k, v in r.scores.items()
                if k[0] in benches and r.variants.get(k[0], "") in benches[k[0]]
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


def _rest_key(r: Run) -> str:
    return json.dumps(r.rest, sort_keys=True, default=str)


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
        _rest_key(r),
    )


def _distinct(cells: list[Cell]) -> None:
    """Cells that share a setting and a label but differ in other config keys: name the keys."""
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.key[:3], c.label()), []).append(c)
    for group in groups.values():
        if len(group) < 2:
            continue
        keys = sorted({k for c in group for k in c.first.rest})
        differ = [k for k in keys if len({json.dumps(c.first.rest.get(k), default=str) for c in group}) > 1]
        for c in group:
            c.distinct = ", ".join(f"{k}={c.first.rest.get(k)}" for k in differ[:3]) + (
                f" +{len(differ) - 3} more" if len(differ) > 3 else ""
            )


def group_cells(runs: list[Run]) -> list[Cell]:
    """Cells in a fixed order: dataset, model, workers, the base model, full, CluSTER by ratio,
    random last. Two runs of one config (the same config hash under two names: the same run
    twice) are refused: a cell counts seeds, not copies."""
    runs = place_base_runs(runs)
    assign_budgets(runs)
    cells: dict[tuple, list[Run]] = {}
    for r in runs:
        cells.setdefault(cell_key(r), []).append(r)
    out = []
    for key in sorted(cells):  # every key position has one type, so tuples compare
        members = sorted(cells[key], key=lambda r: (r.seed, r.run_id))
        seen: dict[tuple, Run] = {}
        for r in members:
            ident = (r.config_hash, r.seed) if r.config_hash else (r.run_id, r.seed)
            if ident in seen:
                raise ReportInputError(
                    f"runs {seen[ident].run_id} ({seen[ident].folder}) and {r.run_id} ({r.folder}) "
                    f"are the same config (config_hash {r.config_hash}, seed {r.seed}) under two "
                    "names: a cell counts seeds, not copies of one run. Remove one of the folders "
                    "from the results (or give the runs different seeds)"
                )
            seen[ident] = r
        out.append(Cell(key, members))
    _distinct(out)
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


def load_kept(runs: list[Run]) -> list[Kept]:
    """The selections of the runs whose folders hold selection.json and pool.jsonl (not full
    data, not the base model), one per (pool, label, kept count): a run that repeats another's
    selection (another training seed, allocator or world size of the same selection) is left
    out."""
    out: list[Kept] = []
    seen: set[tuple] = set()
    pools: dict[Path, dict[str, str | None]] = {}
    for r in sorted(runs, key=lambda x: x.run_id):
        if r.method in ("full", "base") or r.folder is None:  # a diverged run's selection counts
            continue
        d = r.folder
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
