"""Output sets are whole or marked; run-folder files a later stage reads are checked, naming the
file. (Results of an older version: tests/test_store.py.)

The kills are real: a child process SIGKILLs itself at the named point (between the files of a
set, before a report or claims folder is swapped in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.cli import main
from repro.core.results import DamagedResultFile, check_output_set, manifest_path
from repro.core.store import merge_results

REPO = Path(__file__).resolve().parent.parent


def _store(root: Path, shift: float = 0.0) -> Path:
    """Full data and CluSTER r = 0.5, two seeds each: real run folders with synthetic numbers
    (tests/store_helpers.py), held-out loss and the clusters' purity moved by `shift`."""
    from tests.store_helpers import fake_run

    cluster = [
        "selection.method=cluster",
        "allocation.method=cluster-interleave",
        "allocation.weight_mode=rank",
    ]
    for s in (0, 1):
        fake_run(root, ["selection.method=full"], seed=s, loss=2.0 + shift)
        purity = 0.6 + 0.2 * shift
        fake_run(root, cluster, seed=s, n_selected=16, loss=2.2 + shift, train_s=4.0, purity=purity)
    return root


def _run_child(code: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


# ----------------------------------------------------------------------------- class 4


def test_a_results_set_killed_between_its_files_is_refused_by_readers(tmp_path):
    _store(tmp_path)
    out, n = merge_results(tmp_path)
    check_output_set(out)  # whole
    assert json.loads(manifest_path(out).read_text())["rows"] == n
    # kill -9 after the new CSV and its sidecar, before the parquet (a real SIGKILL in a child)
    code = f"""
import os, signal
import repro.core.io as IO
import repro.core.store as S
real = IO.atomic_write
def killing(path, write, mode="w"):
    if str(path).endswith(".parquet"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(path, write, mode)
IO.atomic_write = killing
S.merge_results(__import__("pathlib").Path({str(tmp_path)!r}))
"""
    assert _run_child(code).returncode == -9
    assert not manifest_path(out).exists()
    with pytest.raises(
        DamagedResultFile, match=r"has no manifest results.manifest.json.*rerun `cluster-repro results"
    ):
        check_output_set(out)
    # a reader of the merged CSV (the report) refuses it too, naming the file and the fix
    from reports.build import build_report
    from reports.runs import ReportInputError

    with pytest.raises(ReportInputError, match="results.csv: its set has no manifest"):
        build_report(out, tmp_path / "rep", figures=False)
    # a file of the set changed afterwards (a stale parquet copied in)
    merge_results(tmp_path)
    out.with_suffix(".parquet").write_bytes(b"PAR1 stale")
    with pytest.raises(DamagedResultFile, match=r"results.parquet: does not match the set's manifest"):
        check_output_set(out)


def test_a_report_killed_before_it_is_in_place_leaves_the_old_one_whole(tmp_path):
    from reports.build import build_report

    _store(tmp_path / "runs")
    rep = tmp_path / "report"
    build_report(tmp_path / "runs", rep, figures=False)
    before = {p.relative_to(rep): p.read_bytes() for p in rep.rglob("*") if p.is_file()}
    # new rows, then a report killed after writing every file but before the swap
    import shutil

    shutil.rmtree(tmp_path / "runs")
    _store(tmp_path / "runs", shift=1.0)
    code = f"""
import os, signal
import reports.build as B
B.publish_report = lambda staging, final: os.kill(os.getpid(), signal.SIGKILL)
B.build_report({str(tmp_path / "runs")!r}, {str(rep)!r}, figures=False)
"""
    assert _run_child(code).returncode == -9
    after = {p.relative_to(rep): p.read_bytes() for p in rep.rglob("*") if p.is_file()}
    assert after == before  # the old report, whole: no new table beside the old index.md
    assert list(tmp_path.glob(".report.partial-*"))  # the unfinished one, beside it, hidden
    build_report(tmp_path / "runs", rep, figures=False)  # the next report cleans up
    assert not list(tmp_path.glob(".report.*"))
    assert (rep / "index.md").read_bytes() != before[Path("index.md")]


def test_claims_killed_before_they_are_in_place_leave_the_old_ones_whole(tmp_path):
    """kill -9 during `claims` over an existing folder: the old claims.md, tables and claims.json
    stay together (the set is swapped in whole), never an old claims.md beside new tables."""
    from reports.claims.cli import write_claims

    _store(tmp_path / "runs")
    out = tmp_path / "claims"
    write_claims(tmp_path / "runs", out, figure=False)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    import shutil

    shutil.rmtree(tmp_path / "runs")
    _store(tmp_path / "runs", shift=1.0)
    code = f"""
import os, signal
import reports.build as B
B.publish_report = lambda staging, final: os.kill(os.getpid(), signal.SIGKILL)
from reports.claims.cli import write_claims
write_claims({str(tmp_path / "runs")!r}, {str(out)!r}, figure=False)
"""
    assert _run_child(code).returncode == -9
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    write_claims(tmp_path / "runs", out, figure=False)  # the next run cleans up and swaps in
    assert not list(tmp_path.glob(".claims.*"))
    assert (out / "claims.json").read_bytes() != before[Path("claims.json")]


def test_report_out_that_is_not_a_report_folder_is_never_replaced(tmp_path, capsys):
    _store(tmp_path / "runs")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["report", "--results", str(tmp_path / "runs"), "--out", str(tmp_path / "mine")]) == 2
    assert "is not a report or claims folder" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "afile").write_text("x")
    assert main(["report", "--results", str(tmp_path / "runs"), "--out", str(tmp_path / "afile")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["report", "--results", str(tmp_path / "runs"), "--out", str(tmp_path / "afile" / "r")]) == 2
    assert "afile is a file, not a folder" in capsys.readouterr().err


# ----------------------------------------------------------------------------- class 5


@pytest.fixture(scope="module")
def selected(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sel")
    assert (
        main(["select", "demo-quick", f"output_dir={out}", "selection.method=random", "selection.n=24"]) == 0
    )
    return next(out.glob("*/*"))


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst / src.parent.name / src.name, ignore=shutil.ignore_patterns(".lock"))
    return dst


@pytest.mark.parametrize(
    ("name", "damage", "redo"),
    [
        ("pool.jsonl", "cut", "select"),
        ("heldout.jsonl", "cut", None),
        ("selection.json", "edit", "schedule"),
        ("schedule.json", "edit", None),
        ("selection.csv", "cut", None),
        ("step_tokens.json", "gone", None),
    ],
)
def test_a_run_folder_file_changed_after_its_stage_is_named(selected, tmp_path, capsys, name, damage, redo):
    out = _copy_run(selected, tmp_path)
    run = next(out.glob("*/*"))
    f = run / name
    if damage == "cut":
        f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 3].rsplit(b"\n", 1)[0] + b"\n")
    elif damage == "edit":
        d = json.loads(f.read_text())
        if name == "selection.json":
            d["ids"] = d["ids"][:-1]  # one example fewer, by hand
        else:
            d["worker_weights"][0] = -1.0  # gradient ascent on worker 0, by hand
        f.write_text(json.dumps(d))
    else:
        f.unlink()
    if redo:  # the stage that reads it is redone: it must not take the damaged file
        (run / "stages" / f"{redo}.json").unlink()
    rc = main(["select", "demo-quick", f"output_dir={out}", "selection.method=random", "selection.n=24"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert str(f) in err and ("gone" in err if damage == "gone" else "cut, edited or replaced" in err)
    assert "--force" in err
