"""Typed diagnostics (repro/core/types.py): a selection's and a schedule's diagnostics are written
once, into selection.json and schedule.json, and the result rows' diagnostic rows and the reports
read them, not free `info` keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.core.types import (
    RunFileError,
    ScheduleDiagnostics,
    Selection,
    SelectionDiagnostics,
    StepCost,
    read_selection,
)
from repro.run_rows import diagnostic_rows

BASE = {"run_id": "r", "method": "m"}


def _selection() -> Selection:
    return Selection(
        ids=["a", "b", "c"],
        clusters=[0, 1, 1],
        info={"anything": "for people"},
        diagnostics=SelectionDiagnostics(
            costs={"features": StepCost(1.5, 200.0), "clustering": StepCost(0.25, None)},
            cluster_sizes_before_cap=[2, 4],
            cluster_sizes_after_cap=[3, 3],
            category_agreement={"nmi": 0.5, "ari": 0.25, "purity": 0.75, "n": 6},
        ),
    )


def _rows(selection: Selection, tmp_path: Path) -> dict[tuple[str, str], object]:
    sched = ScheduleDiagnostics(allocation_s=0.01, predicted_idle_share=0.2, worker_idle_shares=[0.1, 0.3])
    rows = diagnostic_rows(BASE, tmp_path, selection, sched, 7, {"strategy": "ddp"})
    return {(r["benchmark"], r["metric"]): (r["value"], r["n"]) for r in rows}


def test_diagnostic_rows_come_from_the_typed_diagnostics(tmp_path: Path) -> None:
    path = tmp_path / "selection.json"
    path.write_text(json.dumps(_selection().to_dict("m")))
    sel = read_selection(path)  # round trip through the file
    assert sel.diagnostics == _selection().diagnostics
    got = _rows(sel, tmp_path)
    assert got[("cost/features", "seconds")] == (1.5, None)
    assert got[("cost/features", "peak_mem_mb")] == (200.0, None)
    assert ("cost/clustering", "peak_mem_mb") not in got  # not measured: no row, never a 0
    assert got[("cluster/1", "size_before_cap")] == (4, None) and got[("cluster/1", "kept")] == (2, None)
    assert got[("cluster/agreement", "ari")] == (0.25, None)
    assert got[("cost/allocation", "seconds")] == (0.01, None)
    assert got[("worker/1", "predicted_idle_share")] == (0.3, 7)
    # free info keys named like diagnostics are not read
    sel.info["cluster_sizes_after_cap"] = [99, 99]
    assert _rows(sel, tmp_path)[("cluster/0", "size_after_cap")] == (3, None)


def test_a_selection_file_without_diagnostics_is_refused_naming_it(tmp_path: Path) -> None:
    """The diagnostics are read from `diagnostics` only, never from free `info` keys."""
    d = {
        "method": "cluster",
        "ids": ["a", "b"],
        "clusters": [0, 1],
        "info": {"features_s": 2.0, "cluster_sizes_after_cap": [1, 1], "with_replacement": False},
    }
    path = tmp_path / "selection.json"
    path.write_text(json.dumps(d))
    with pytest.raises(RunFileError, match="diagnostics is None, expected a mapping") as e:
        read_selection(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"ids": "a"}, "expected JSON with a list 'ids'"),
        ({"clusters": [0]}, "clusters is not a list of 3 entries"),
        ({"diagnostics": {"cluster_sizes_after_cap": ["3", 3]}}, "diagnostics: cluster_sizes_after_cap is"),
        (
            {"diagnostics": {"costs": {"features": {"seconds": "fast"}}}},
            r"diagnostics.costs.features: seconds",
        ),
    ],
)
def test_a_malformed_selection_file_names_the_file_and_key(tmp_path: Path, change: dict, match: str) -> None:
    d = {**_selection().to_dict("m"), **change}
    path = tmp_path / "selection.json"
    path.write_text(json.dumps(d))
    with pytest.raises(RunFileError, match=match) as e:
        read_selection(path)
    assert str(path) in str(e.value)


def test_repeats_are_said_in_the_diagnostics_not_in_info() -> None:
    from repro.core.types import Example, Pool
    from repro.pipeline import validate_selection

    pool = Pool([Example(id=i, prompt="p", response="r", source="s") for i in "ab"])
    said = Selection(ids=["a", "a", "b"], diagnostics=SelectionDiagnostics(with_replacement=True))
    validate_selection(said, pool, "plugin")
    for sel in (Selection(ids=["a", "a"]), Selection(ids=["a", "a"], info={"with_replacement": True})):
        with pytest.raises(ValueError, match="duplicate ids; set diagnostics.with_replacement"):
            validate_selection(sel, pool, "plugin")
