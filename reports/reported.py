"""The paper's reported numbers (reports/reported.yaml) beside ours, with the difference.

An entry matches our cell when dataset, model, method and ratio agree (and weight_mode and
selection params where the entry names them), at 4 workers (the paper's main setting). Where no
run of ours has that cell, "ours" and the difference show as missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reports.load import Cell, ReportInputError, norm_benchmark
from reports.tables import Column, Report, Table

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
}


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


def paper_cells(entries: list[dict[str, Any]]) -> list[PaperCell]:
    """The main-table entries grouped into lines, in the file's order."""
    lines: dict[tuple, dict[str, float]] = {}
    for e in entries:
        if e["section"] != MAIN_SECTION:
            continue
        key = (e["dataset"], e["model"], int(e.get("world_size", 4)), e["method"], e.get("ratio"))
        lines.setdefault(key, {})[str(e["quantity"])] = float(e["value"])
    return [PaperCell(*key, values=v) for key, v in lines.items()]


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


def _ours(rep: Report, c: Cell, q: str) -> Any:
    """Our value of quantity q for cell c, in the entry's unit (or None)."""
    if q == "data_used":
        return rep.kept_cell(c)
    if q == "train_time":
        return rep.cost_cell(c, "train_s", 1 / 3600)
    if q == "train_time_reduction":
        v = rep.reduction(c, "train_s")
        return v if isinstance(v, float) else None
    if q == "category_agreement":
        return rep.diag_cell(c, "cluster/agreement", "purity", 100)
    if q == "avg_score":
        for d in rep.domains:
            est = rep.domain_cell(c, d)
            if est not in ("", None):
                return est
        return None
    bench = norm_benchmark(q.split(":", 1)[1])
    for key in rep.quality:
        if norm_benchmark(key[0]) == bench and key[1] is not None:
            est = rep.quality_cell(c, key)
            return est if est != "" else None
    return None


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
        Column("note"),
    ]
    rows = []
    for e in entries:
        cell = next((c for c in rep.cells if _matches(c, e)), None)
        ours = _ours(rep, cell, str(e["quantity"])) if cell else None
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
                e.get("note", ""),
            ]
        )
    return Table(
        "reported",
        "The paper's reported numbers beside ours",
        cols,
        rows,
        notes=[
            "Reported values transcribed in reports/reported.yaml from ../shared/docs/method.md "
            "(itself from summaries of the paper, not yet checked against the PDF).",
            "ours: our cell with the same dataset, model, method and ratio at 4 workers; missing "
            "where we have no such run. Train time in hours.",
        ],
    )


__all__ = ["MAIN_SECTION", "PaperCell", "load_reported", "paper_cells", "reported_table"]
