"""The paper's reported numbers (reports/reported.yaml) beside ours, with the difference.

An entry matches our cell when dataset, model, method and ratio agree (and weight_mode and
selection params where the entry names them), at 4 workers (the paper's main setting). Where no
run of ours has that cell, "ours" and the difference show as missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reports.load import Cell
from reports.runs import ReportInputError, norm_benchmark, split_protocol
from reports.values import Column, Report, Table

REPORTED_FILE = Path(__file__).resolve().parent / "reported.yaml"
QUANTITIES = ("data_used", "avg_score", "train_time", "train_time_reduction", "category_agreement")
ENTRY_KEYS = {
    "section",
    "dataset",
    "model",
    "method",
    "ratio",
    "quantity",
    "value",
    "unit",
    "note",
    "weight_mode",
    "selection_params",
    "world_size",
    "protocol",
}
PROTOCOL_DIFFERS = "protocol differs"
SCORE_QUANTITIES = ("avg_score",)  # and score:<benchmark>: the quantities a protocol measures


def load_reported(path: Path = REPORTED_FILE) -> list[dict[str, Any]]:
    """The entries, checked: every entry names its section, cell, quantity and value."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise ReportInputError(f"{path}: expected a top-level 'entries' list")
    for i, e in enumerate(entries):
        where = f"{path}: entries[{i}]"
        if not isinstance(e, dict):
            raise ReportInputError(f"{where}: expected a mapping")
        unknown = set(e) - ENTRY_KEYS
        if unknown:
            raise ReportInputError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(ENTRY_KEYS)})")
        for k in ("section", "dataset", "model", "method", "quantity", "value"):
            if k not in e:
                raise ReportInputError(f"{where}: missing {k!r}")
        q = str(e["quantity"])
        if q not in QUANTITIES and not q.startswith("score:"):
            raise ReportInputError(f"{where}: quantity {q!r} is not one of {QUANTITIES} or score:<benchmark>")
        if not isinstance(e["value"], (int, float)):
            raise ReportInputError(f"{where}: value {e['value']!r} is not a number")
        if (q in SCORE_QUANTITIES or q.startswith("score:")) and not isinstance(e.get("protocol"), str):
            raise ReportInputError(
                f"{where}: a score needs its protocol (protocol: evalplus or lm-eval, how the "
                "paper measured it), so that it is compared only with our rows of that protocol"
            )
    return entries


# The section of reported.yaml that transcribes the paper's main table: the rows the compact
# main tables and the quality-vs-data figure draw beside ours (the ablations and Magicoder's
# README scores stay in the `reported` table only).
MAIN_SECTION = "Reported numbers"


@dataclass(frozen=True)
class PaperCell:
    """One line of the paper's main table: a setting, a method at a ratio, and its numbers
    (quantity -> value in the entry's unit: % for data used and scores, hours for train time)."""

    dataset: str
    model: str
    world_size: int
    method: str
    ratio: float | None
    values: dict[str, float]
    protocols: dict[str, str] = field(default_factory=dict)  # quantity -> how it was scored


def paper_cells(entries: list[dict[str, Any]]) -> list[PaperCell]:
    """The main-table entries grouped into lines, in the file's order."""
    lines: dict[tuple, dict[str, float]] = {}
    protocols: dict[tuple, dict[str, str]] = {}
    for e in entries:
        if e["section"] != MAIN_SECTION:
            continue
        key = (e["dataset"], e["model"], int(e.get("world_size", 4)), e["method"], e.get("ratio"))
        lines.setdefault(key, {})[str(e["quantity"])] = float(e["value"])
        if e.get("protocol"):
            protocols.setdefault(key, {})[str(e["quantity"])] = str(e["protocol"])
    return [PaperCell(*key, values=v, protocols=protocols.get(key, {})) for key, v in lines.items()]


def _matches(c: Cell, e: dict[str, Any]) -> bool:
    r = c.first
    ratio = e.get("ratio")
    if (r.dataset, r.model, r.method) != (e["dataset"], e["model"], e["method"]):
        return False
    if (r.ratio is None) != (ratio is None) or (ratio is not None and abs(r.ratio - ratio) > 1e-9):
        return False
    if r.world_size != e.get("world_size", 4) or r.budget:
        return False
    if "weight_mode" in e and r.weight_mode != e["weight_mode"]:
        return False
    defaults = {"prune": "close"} if r.method == "cluster" else {}
    for k, v in (e.get("selection_params") or {}).items():
        if str(r.params.get(k, defaults.get(k))) != str(v):
            return False
    return True


def _ours(rep: Report, c: Cell, q: str, protocol: str = "lm-eval") -> Any:
    """Our value of quantity q for cell c, in the entry's unit (or None); a score only under the
    entry's `protocol`, and PROTOCOL_DIFFERS where we have it under another protocol only."""
    if q == "data_used":
        return rep.kept_cell(c)
    if q == "train_time":
        return rep.cost_cell(c, "train_s", 1 / 3600)
    if q == "train_time_reduction":
        v = rep.reduction(c, "train_s")
        return v if isinstance(v, float) else None
    if q == "category_agreement":
        return rep.diag_cell(c, "cluster/agreement", "purity", 100)
    other = False
    if q == "avg_score":
        for d in rep.domains:
            est = rep.domain_cell(c, d)
            if est not in ("", None):
                if split_protocol(d)[1] == protocol:
                    return est
                other = True
        return PROTOCOL_DIFFERS if other else None
    bench = norm_benchmark(q.split(":", 1)[1])
    for key in rep.quality:
        name, proto = split_protocol(key[0])
        if norm_benchmark(name) == bench and key[1] is not None:
            est = rep.quality_cell(c, key)
            if est in ("", None):
                continue
            if proto == protocol:
                return est
            other = True
    return PROTOCOL_DIFFERS if other else None


def reported_table(rep: Report, entries: list[dict[str, Any]]) -> Table:
    cols = [
        Column("section"),
        Column("setting"),
        Column("method"),
        Column("quantity"),
        Column("unit"),
        Column("reported", "num2"),
        Column("ours", "num2"),
        Column("ours - reported", "delta2"),
        Column("protocol"),
        Column("note"),
    ]
    rows = []
    for e in entries:
        cell = next((c for c in rep.cells if _matches(c, e)), None)
        ours = _ours(rep, cell, str(e["quantity"]), e.get("protocol", "lm-eval")) if cell else None
        ours_v = ours if isinstance(ours, float) else getattr(ours, "value", None)
        method = e["method"] + (f" r={e['ratio'] / 100:g}" if e.get("ratio") is not None else "")
        extra = [f"{k}={v}" for k, v in sorted((e.get("selection_params") or {}).items())]
        if "weight_mode" in e:
            extra.append(f"weights={e['weight_mode']}")
        if extra:
            method += " (" + ", ".join(extra) + ")"
        rows.append(
            [
                e["section"],
                f"{e['dataset']} · {e['model']}",
                f"{method} [reported]",
                e["quantity"],
                e.get("unit", ""),
                float(e["value"]),
                ours,
                None if ours_v is None else ours_v - float(e["value"]),
                e.get("protocol", ""),
                e.get("note", ""),
            ]
        )
    return Table(
        "reported",
        "The paper's reported numbers beside ours",
        cols,
        rows,
        notes=[
            "Reported values transcribed in reports/reported.yaml from docs/method.md "
            "(itself from summaries of the paper, not yet checked against the PDF).",
            "ours: our cell with the same dataset, model, method and ratio at 4 workers; missing "
            "where we have no such run. Train time in hours.",
            "A score is compared only with ours under the same protocol (our rows' eval_protocol); "
            f"'{PROTOCOL_DIFFERS}': we scored that cell under another protocol only. Medical: "
            "the paper's protocol is assumed (log-likelihood multiple choice, lm-eval).",
        ],
    )


def protocol_gap_table(rep: Report) -> Table:
    """The same model scored under two protocols: per cell and benchmark, each protocol's score
    and the gap (evalplus minus lm-eval), where a cell has both."""
    by_bench: dict[str, dict[str, Any]] = {}
    for key in rep.quality:
        name, proto = split_protocol(key[0])
        if key[1] is not None:
            by_bench.setdefault(name, {})[proto] = key
    cols = [
        Column("setting"),
        Column("method"),
        Column("benchmark"),
        Column("lm-eval", "pct"),
        Column("evalplus", "pct"),
        Column("evalplus - lm-eval", "delta"),
    ]
    rows = []
    for c in rep.cells:
        for name, keys in sorted(by_bench.items()):
            if not {"lm-eval", "evalplus"} <= set(keys):
                continue
            a, b = rep.quality_cell(c, keys["lm-eval"]), rep.quality_cell(c, keys["evalplus"])
            va, vb = getattr(a, "value", None), getattr(b, "value", None)
            if va is None or vb is None:
                continue
            rows.append([f"{c.first.dataset} · {c.first.model}", c.label(), name, a, b, vb - va])
    return Table(
        "protocol_gap",
        "One model, two scoring protocols",
        cols,
        rows,
        notes=[
            "The same trained model scored by lm-eval's task prompts (lm-eval) and by EvalPlus with "
            "the training template and Magicoder's response prefix (evalplus); docs/benchmarks.md. "
            "The gap is the protocol's, not the method's."
        ],
    )


__all__ = [
    "MAIN_SECTION",
    "PROTOCOL_DIFFERS",
    "PaperCell",
    "load_reported",
    "paper_cells",
    "protocol_gap_table",
    "reported_table",
]
