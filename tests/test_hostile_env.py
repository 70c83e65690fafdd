"""Issue 26, classes 7 and 8: errors of the environment name the path and the fix, signals end a
run in one line with the attempt recorded as interrupted, and unclear errors are made clear.

Real conditions, no mocks: a full disk is a 24 KiB tmpfs and a read-only one a tmpfs mounted
read-only, each in a private mount namespace (`unshare -m`, as the code sandbox uses); permission
denied is a folder of mode 555 seen from a user namespace without root's override (`unshare -U`);
the signals are real SIGTERM / SIGINT sent to a real `cluster-repro` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "repro"]


def _cli(*args: str, wrap: list[str] | None = None, cwd: Path | None = None, env=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [*(wrap or []), *CLI, *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_a_full_disk_names_the_file_and_the_fix(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    sh = f'mount -t tmpfs -o size=24k tmpfs {mnt} && exec "$@"'
    p = _cli(
        "select",
        "demo-quick",
        f"output_dir={mnt}/runs",
        "selection.method=random",
        "selection.n=24",
        wrap=["unshare", "-m", "sh", "-c", sh, "sh"],
    )
    line = _one_error_line(p)
    assert p.returncode == 2 and f"{mnt}/runs/" in line and "no space left" in line and "[Errno 28]" in line
    assert "run the same command again to resume" in line


def _preflight_line(p: subprocess.CompletedProcess) -> str:
    """The one problem preflight found (an output_dir this user cannot write is refused before any
    stage, by every command alike: repro/preflight_paths.py)."""
    assert "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("config error: 1 problem(s)"), p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("  error  ")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_a_read_only_output_dir_names_it(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    sh = f'mount -t tmpfs -o ro tmpfs {mnt} && exec "$@"'
    p = _cli("select", "demo-quick", f"output_dir={mnt}/runs", wrap=["unshare", "-m", "sh", "-c", sh, "sh"])
    line = _preflight_line(p)
    assert p.returncode == 2 and f"output_dir: '{mnt}/runs': '{mnt}' is on a read-only filesystem" in line
    assert "choose a writable folder as output_dir" in line


def test_permission_denied_names_the_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    p = _cli("select", "demo-quick", f"output_dir={locked}/runs", wrap=["unshare", "-U"])
    line = _preflight_line(p)
    assert p.returncode == 2 and f"output_dir: '{locked}/runs': '{locked}': permission denied" in line
    assert "chmod" in line


def test_paths_below_a_file(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    p = _cli("select", "demo-quick", f"output_dir={f}/runs")
    assert p.returncode == 2 and f"output_dir: '{f}/runs': '{f}' is a file, not a folder" in _preflight_line(
        p
    )
    from tests.store_helpers import fake_run

    fake_run(tmp_path / "runs", ["selection.method=full"])
    from repro.cli import main

    assert main(["results", "--results", str(tmp_path / "runs"), "--out", str(f / "r.csv")]) == 2
    err = capsys.readouterr().err
    assert "a part of the path is a file" in err and str(f) in err and "Traceback" not in err
    assert main(["report", "--results", str(tmp_path / "runs"), "--out", str(f)]) == 2
    assert f"--out {f}: is a file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- signals


def _held_run(tmp_path: Path, **popen) -> tuple[subprocess.Popen, Path]:
    hold = tmp_path / "hold"
    hold.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
        "CLUSTER_REPRO_TEST_HOLD": str(hold),
    }
    proc = subprocess.Popen(
        [
            *CLI,
            "select",
            "demo-quick",
            f"output_dir={tmp_path / 'runs'}",
            "selection.method=run_safety_helpers:RecordedFeatures",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **popen,
    )
    deadline = time.monotonic() + 240
    while not (hold / "inside").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc, next((tmp_path / "runs").glob("*/*"))


def _as_a_terminal_starts_it() -> None:
    """In the child before exec: SIGINT delivered and at its default, as for a command typed at a
    terminal. A process that inherits SIGINT ignored or blocked (from a test process some library
    left so; or `nohup`, `&` in a script) keeps it so: Python then has no Ctrl-C to raise."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("sig", "code", "word"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")]
)
def test_a_signal_ends_the_run_in_one_line_recorded_as_interrupted(tmp_path, sig, code, word):
    proc, run = _held_run(tmp_path, start_new_session=True, preexec_fn=_as_a_terminal_starts_it)
    os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C or a scheduler's SIGTERM would
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(f"interrupted ({word})")
    attempts = json.loads((run / "stages" / "attempts.json").read_text())
    assert attempts["select"][-1]["status"] == "interrupted"


def test_stop_workers_ends_spawned_children_quietly():
    import multiprocessing as mp

    from repro.cli import _stop_workers

    ctx = mp.get_context("spawn")
    child = ctx.Process(target=time.sleep, args=(60,))
    child.start()
    _stop_workers()
    assert not child.is_alive() and child.exitcode == -signal.SIGTERM


# ----------------------------------------------------------------------------- class 8


@pytest.mark.parametrize("kind", ["fifo", "devzero", "folder"])
def test_a_data_source_that_is_not_a_file_says_what_it_is(tmp_path, kind):
    from repro.core.config.load import load_config
    from repro.core.data import load_pool
    from repro.core.prompts import DataError
    from repro.preflight import preflight

    p = tmp_path / "x.jsonl"
    if kind == "fifo":
        os.mkfifo(p)
        want = "FIFO"
    elif kind == "devzero":
        p.symlink_to("/dev/zero")
        want = "symlink to '/dev/zero', which is a device"
    else:
        p.mkdir()
        want = "a folder, not a file"
    cfg = load_config("demo-quick", [f"data_dir={tmp_path}", "data.sources=[{path: x.jsonl}]"])
    problems = [str(x) for x in preflight(cfg)]
    assert any("data.sources[0].path" in x and want in x for x in problems), problems
    assert not any("not found" in x for x in problems)
    with pytest.raises(DataError, match=want.replace("(", r"\(")):
        load_pool(cfg)


def test_a_cut_features_file_is_named(tmp_path):
    from method.selector import _load_features
    from repro.core.interfaces import SelectionError

    f = tmp_path / "features.npy"
    np.save(f, np.ones((10, 4), np.float32))
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(SelectionError, match=rf"{f}: the features file is damaged or cut.*delete it"):
        _load_features(f, 10)
    np.save(f, np.ones((9, 4), np.float32))
    with pytest.raises(SelectionError, match=r"expected 10 rows"):
        _load_features(f, 10)
