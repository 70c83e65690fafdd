"""Files the suite writes (issue 14): result part files carry a checksum that `results` and `report`
check, so a cut or changed part is named and skipped loudly, never silently merged; conflicting
duplicate rows are an error naming both files; every file and folder follows the umask; a temp
file orphaned by a kill is removed by the next write into its folder.

The runs are real run folders with synthetic numbers (tests/store_helpers.py), their rows written
by the results stage. Damage is made by cutting or editing the written bytes, as a kill, a full
disk or a stopped copy would.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reports.build import build_report
from reports.runs import ReportInputError
from repro.core.results import (
    COLUMNS,
    PART_NAME,
    ConflictingRowsError,
    DamagedResultsError,
    read_checked,
    read_rows,
    sidecar_path,
    write_rows,
)
from repro.core.store import StoreError, merge_results
from tests.conftest import REPO
from tests.store_helpers import fake_run, run_id_of

RUNS = 3


def _store(root: Path) -> tuple[list[Path], int]:
    """RUNS finished runs under root/<name>/<hash>/; -> their part files, their rows in all."""
    parts, total = [], 0
    for seed in range(RUNS):
        run = fake_run(root, ["selection.method=full"], seed=seed, loss=2.0 + seed / 10)
        parts.append(run / PART_NAME)
        total += len(read_rows(run / PART_NAME))
    return parts, total


def _cut_mid_row(data: bytes) -> bytes:
    last = data.rstrip(b"\r\n").rfind(b"\n") + 1
    return data[: last + 10]  # inside the last row's run_id


def _cut_in_quotes(data: bytes) -> bytes:
    q = data.rfind(b'"{""')
    assert q > data.find(b"\n")  # a JSON field in a row, not the header
    return data[: q + 8]  # inside a JSON column's quoted field


def _cut_in_header(data: bytes) -> bytes:
    return data[:40]


def _cut_at_row_boundary(data: bytes) -> bytes:
    lines = data.split(b"\n")
    return b"\n".join(lines[: len(lines) // 2]) + b"\n"  # whole rows, half of them


def _changed_value(data: bytes) -> bytes:
    head, _, rest = data.partition(b"\r\n")
    row, _, tail = rest.partition(b"\r\n")
    fields = next(csv.reader([row.decode()]))
    cols = head.decode().split(",")
    fields[cols.index("value")] = "0.999"
    import io

    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(fields)
    return head + b"\r\n" + buf.getvalue().encode() + b"\r\n" + tail


DAMAGE = {
    "cut mid-row": (_cut_mid_row, "does not match its checksum"),
    "cut inside a quoted field": (_cut_in_quotes, "does not match its checksum"),
    "cut inside the header": (_cut_in_header, "does not match its checksum"),
    "cut between rows": (_cut_at_row_boundary, "does not match its checksum"),
    "value changed": (_changed_value, "does not match its checksum"),
}


@pytest.mark.parametrize("case", list(DAMAGE) + ["no sidecar", "sidecar cut"])
def test_a_damaged_part_is_named_and_skipped_only_when_allowed(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    parts, total = _store(tmp_path)
    victim = parts[1]
    lost = len(read_checked(victim, require_sidecar=True))
    if case == "no sidecar":
        sidecar_path(victim).unlink()
        reason = "has no checksum file results.part.csv.sha256"
    elif case == "sidecar cut":
        sidecar_path(victim).write_bytes(sidecar_path(victim).read_bytes()[:30])
        reason = "its checksum file results.part.csv.sha256 is unreadable or cut"
    else:
        damage, reason = DAMAGE[case]
        victim.write_bytes(damage(victim.read_bytes()))
    # results: stops, names the file and why, writes nothing.
    with pytest.raises(DamagedResultsError) as e:
        merge_results(tmp_path)
    assert f"{victim}: {reason}" in str(e.value) and "--allow-damaged" in str(e.value)
    assert not (tmp_path / "results.csv").exists()
    # ... unless allowed: the others merge, the damaged one is named on stderr.
    path, n = merge_results(tmp_path, allow_damaged=True)
    assert n == total - lost and str(victim) in capsys.readouterr().err
    with open(path, newline="") as fh:
        assert {r["run_id"] for r in csv.DictReader(fh)} == {run_id_of(p.parent) for p in parts[::2]}
    # report: the same.
    with pytest.raises(ReportInputError, match="damaged results file"):
        build_report(tmp_path, tmp_path / "report", figures=False)
    index = build_report(tmp_path, tmp_path / "report", figures=False, allow_damaged=True)
    assert f"skipped damaged results file {victim}: {reason}" in index.read_text()


@pytest.mark.parametrize(
    "damage,reason",
    [
        (_cut_mid_row, "ends without a newline, cut in line"),
        (_cut_in_quotes, "ends without a newline, cut in line"),
        (_cut_in_header, "ends without a newline, cut inside its header"),
        (lambda d: _cut_in_quotes(d) + b"\n", "is not valid CSV (unexpected end of data)"),
        (
            lambda d: d.replace(b"\r\n", b",x\r\n", 2).replace(b",x", b"", 1),
            f"row 2 has {len(COLUMNS) + 1} fields, the header {len(COLUMNS)}",
        ),
        (lambda d: b"", "is empty"),
        (lambda d: b"\xff\xfe" + d, "is not UTF-8 text"),
    ],
)
def test_a_csv_without_a_sidecar_is_still_checked_for_cuts(damage, reason: str, tmp_path: Path) -> None:
    """A merged or hand-made CSV has no sidecar to compare against, but every cut that the CSV
    shape shows is still caught (what a header cut used to turn into a KeyError traceback)."""
    parts, _ = _store(tmp_path / "runs")
    src = tmp_path / "mine.csv"
    write_rows(src, read_rows(parts[0]))
    sidecar_path(src).unlink()
    src.write_bytes(damage(src.read_bytes()))
    with pytest.raises(ReportInputError, match="damaged results file") as e:
        build_report(src, tmp_path / "report", figures=False)
    assert f"{src}: {reason}" in str(e.value)


def test_a_copied_run_folder_is_refused_naming_both_and_conflicting_rows_name_both_lines(
    tmp_path: Path,
) -> None:
    """A run is its folder: a copy of a run folder inside the results folder (a backup) is the
    same run twice, refused naming both folders. Two different rows for one measurement (one run,
    eval, protocol, benchmark and metric) are refused naming both lines."""
    parts, _ = _store(tmp_path)
    run = parts[0].parent
    shutil.copytree(run, tmp_path / "backup" / run.parent.name / run.name)
    with pytest.raises(StoreError, match=rf"two run folders are both run {run_id_of(run)}: .*backup"):
        merge_results(tmp_path)
    with pytest.raises(ReportInputError, match=r"two run folders are both run .*backup"):
        build_report(tmp_path, tmp_path / "report", figures=False)
    shutil.rmtree(tmp_path / "backup")
    rows = read_checked(parts[0], require_sidecar=True)
    rows.append({**rows[3], "value": "0.123"})  # the same measurement twice, another value
    write_rows(parts[0], rows)
    with pytest.raises(
        ConflictingRowsError, match=r"two different rows for run .*:5 and .*they differ in value"
    ):
        merge_results(tmp_path)


def test_cli_results_report_and_claims_exit_2_naming_the_part_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from repro.cli import main

    parts, total = _store(tmp_path)
    parts[2].write_bytes(_cut_in_header(parts[2].read_bytes()))
    for cmd in (
        ["results", "--results", str(tmp_path)],
        ["report", "--results", str(tmp_path), "--out", str(tmp_path / "r")],
        ["claims", "--results", str(tmp_path), "--out", str(tmp_path / "c"), "--no-figure"],
    ):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: 1 damaged results file(s)") and str(parts[2]) in err
        assert "Traceback" not in err
        assert main([*cmd, "--allow-damaged"]) == 0
        assert "skipped" in capsys.readouterr().err
    assert (tmp_path / "results.csv").is_file() and (tmp_path / "r" / "index.md").is_file()


def test_merged_results_carry_a_checksum_that_the_report_checks(tmp_path: Path) -> None:
    _store(tmp_path / "runs")
    merged, n = merge_results(tmp_path / "runs")
    assert json.loads(sidecar_path(merged).read_text())["rows"] == n
    build_report(merged, tmp_path / "ok", figures=False)
    merged.write_bytes(_cut_at_row_boundary(merged.read_bytes()))
    with pytest.raises(ReportInputError, match=r"results\.csv: does not match the set's manifest"):
        build_report(merged, tmp_path / "bad", figures=False)


# ----------------------------------------------------------------------------- modes


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_files_and_folders_follow_the_umask(umask: int, tmp_path: Path) -> None:
    """Atomic writes (mkstemp makes 0600 files), merged results, Parquet and the report end as
    0666 & ~umask, their folders 0777 & ~umask: lab-mates can read a shared output_dir."""
    from repro.core.io import atomic_write_json, atomic_write_jsonl

    old = os.umask(umask)
    try:
        root = tmp_path / "out"
        _store(root)
        atomic_write_json(root / "a" / "b.json", {"x": 1})
        atomic_write_jsonl(root / "a" / "c.jsonl", [{"x": 1}])
        merge_results(root)
        build_report(root, root / "report", figures=False)
    finally:
        os.umask(old)
    files = [p for p in root.rglob("*") if p.is_file()]
    dirs = [root, *(p for p in root.rglob("*") if p.is_dir())]
    assert len(files) > 30 and any(p.suffix == ".parquet" for p in files)
    assert any(p.name.endswith(".sha256") for p in files)
    bad = {
        str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in files
        if stat.S_IMODE(p.stat().st_mode) != 0o666 & ~umask
    }
    bad.update(
        {
            str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
            for p in dirs
            if stat.S_IMODE(p.stat().st_mode) != 0o777 & ~umask
        }
    )
    assert bad == {}


def test_the_saved_model_follows_the_umask(tmp_path: Path) -> None:
    """save_finetuned builds in a mkdtemp folder (0700) and safetensors writes 0600 files: a run
    under umask 002 left `model/` unreadable to the group before."""
    from repro.core.config.schema import LoraConfig, ModelConfig
    from repro.core.models import load_model_and_tokenizer, materialize_model, save_finetuned

    cfg = ModelConfig(name_or_path="tiny-random-llama", lora=LoraConfig(r=2, alpha=4))
    model, tok = load_model_and_tokenizer(materialize_model(cfg, seed=0), cfg)
    old = os.umask(0o002)
    try:
        save_finetuned(model, tok, tmp_path / "run" / "model")
    finally:
        os.umask(old)
    out = tmp_path / "run" / "model"
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in [out, *out.iterdir()]}
    assert "adapter_model.safetensors" in modes
    assert modes == {
        name: oct(0o775 if (out / name).is_dir() or name == "model" else 0o664) for name in modes
    }


# ----------------------------------------------------------------------------- orphan temps


def _killed_mid_write(target: Path) -> int:
    """Run a process that starts an atomic write of `target` and is SIGKILLed inside it (no
    `finally` runs); -> its pid."""
    code = (
        "import os, signal, sys\n"
        "from repro.core.io import atomic_write\n"
        "def w(fh):\n"
        "    fh.write('half'); fh.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic_write(sys.argv[1], w)\n"
    )
    return _run_killed(code, target)


def _run_killed(code: str, arg: Path) -> int:
    """Run `code` (which SIGKILLs itself) with `arg`; -> the dead process's pid."""
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(arg)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert p.wait(timeout=60) == -signal.SIGKILL
    return p.pid


def test_a_temp_file_orphaned_by_a_kill_is_removed_by_the_next_write(tmp_path: Path) -> None:
    from repro.core.io import atomic_write_json, remove_stale_temps

    run = tmp_path / "run"
    pid = _killed_mid_write(run / "stages" / "train.json")
    orphans = list((run / "stages").glob(".train.json.tmp-*"))
    assert len(orphans) == 1 and f".tmp-{pid}-" in orphans[0].name
    # Not ours to remove: another host's temp (a shared file system) and a live process's.
    host = socket.gethostname()
    other_host = run / "stages" / f".x.json.tmp-{pid}-abc@not-{host}"
    live = run / "stages" / f".y.json.tmp-{os.getpid()}-abc@{host}"
    other_host.write_text("")
    live.write_text("")
    atomic_write_json(run / "stages" / "select.json", {"ok": 1})  # any later write there
    assert not orphans[0].exists()
    assert other_host.exists() and live.exists()
    assert remove_stale_temps(run / "stages") == []


def test_an_orphaned_features_temp_is_removed_by_the_next_feature_pass(tmp_path: Path) -> None:
    """The issue's case: `.features.npy.tmp-PID` left by a killed feature pass. The next pass in
    that folder removes it first thing, and leaves no temp of its own even when it fails (here
    it fails at once, on a model folder that does not exist: no model is needed to show it)."""
    from method.features import features_to_file
    from repro.core.config.schema import LoraConfig, ModelConfig
    from repro.core.io import temp_path
    from repro.core.models import ModelLoadError

    cfg = ModelConfig(name_or_path="tiny-random-llama", lora=LoraConfig(enabled=False))
    run = tmp_path / "run"
    run.mkdir()
    code = (
        "import os, signal, sys\n"
        "from repro.core.io import temp_path\n"
        "open(temp_path(sys.argv[1]), 'wb').write(b'half')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    pid = _run_killed(code, run / "features.npy")
    mine = temp_path(run / "features.npy")
    orphan = mine.with_name(mine.name.replace(f"-{os.getpid()}@", f"-{pid}@"))
    assert orphan.is_file() and orphan.name.startswith(".features.npy.tmp-")
    with pytest.raises(ModelLoadError, match="no-model"):
        features_to_file(run, 1, tmp_path / "no-model", cfg, 64, 2, run / "features.npy")
    assert sorted(p.name for p in run.iterdir()) == []
