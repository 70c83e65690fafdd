"""Integrity of a run folder (issue 14): the hostile-but-fair cases, each a test.

- Inputs: a pool file cut from 40 to 20 rows, or data_dir pointed at another folder holding a
  file of the same name, stops the rerun with a message naming the file (rows, hash) instead of
  reusing the old pool; a moved identical file is the same input; --force redoes the work. A
  changed model directory or features file stops it too.
- One writer: a second run of a cell that another process is writing stops with a message naming
  that process (pid, host), or waits with wait_lock; a killed holder frees the folder (SLURM
  requeue).
- Costs: a run killed with SIGKILL after its features were written, then rerun, counts the
  killed attempt's seconds up to the features in selection_s and records attempts = 2.
- Divergence: a training whose loss becomes NaN stops (ddp and fsdp), writes a result row with
  status diverged naming the step, and the report shows "diverged", never "missing".

Real parts throughout: tiny random Llama, real gloo process groups, real kill -9 of a real run
process (tests/run_safety_helpers.py holds it at a known point), real flock.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from repro.cli import main as cli_main
from repro.core import rundir
from repro.core.config.load import from_dict, save_config
from repro.core.io import read_json
from repro.core.results import PART_NAME, read_rows
from repro.core.rundir import RunLocked, stage_marker
from repro.pipeline import InputsChanged, TrainingDiverged, run_experiment
from repro.run_rows import stage_seconds
from tests.conftest import REPO

TINY = [
    "name=t",
    "model.name_or_path=tiny-random-llama",
    "data.max_length=256",
    "eval.benchmarks=[]",
    "world_size=2",
    "train.per_device_batch_size=1",
    "train.global_batch_size=2",
]
DEMO = ["data.sources=[{path: demo, params: {train_size: 24, heldout_per_category: 1}}]"]
HELPER = "selection.method=tests.run_safety_helpers:RecordedFeatures"


def _cfg(out: Path, *extra: str):
    return from_dict({}, [f"output_dir={out}", *TINY, *extra])


def _alpaca(path: Path, n: int, tag: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"instruction": f"Say {tag}{k}.", "input": "", "output": f"{tag}{k}"} for k in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _file_cfg(out: Path, data_dir: Path):
    return _cfg(out, f"data_dir={data_dir}", "data.sources=[{path: pool.jsonl}]")


def _cli(cfg, tmp_path: Path, *args: str) -> int:
    """`cluster-repro ARGS CONFIG` in this process, on `cfg` saved as a config file."""
    path = tmp_path / f"cfg-{time.monotonic_ns()}.yaml"
    save_config(cfg, path)
    return cli_main([args[0], str(path), *args[1:]])


# ----------------------------------------------------------------------------- inputs


def test_a_pool_file_cut_in_half_stops_the_rerun_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = tmp_path / "data"
    _alpaca(data / "pool.jsonl", 40)
    cfg = _file_cfg(tmp_path / "runs", data)
    run_dir = run_experiment(cfg, until="pool")
    assert read_json(stage_marker(run_dir, "pool"))["n_pool"] == 36  # 40 less 10% held out
    config_before = (run_dir / "config.yaml").read_bytes()

    _alpaca(data / "pool.jsonl", 20)
    with pytest.raises(InputsChanged) as e:
        run_experiment(cfg, until="schedule")
    msg = str(e.value)
    assert "data.sources[0].path 'pool.jsonl' changed: 40 -> 20 rows" in msg
    assert str(data / "pool.jsonl") in msg and "--force" in msg
    # Nothing was reused, redone or rewritten.
    assert read_json(stage_marker(run_dir, "pool"))["n_pool"] == 36
    assert not stage_marker(run_dir, "select").exists()
    assert (run_dir / "config.yaml").read_bytes() == config_before
    # The command line says the same, as an error message (exit 2), not a traceback.
    assert _cli(cfg, tmp_path, "select") == 2
    assert "40 -> 20 rows" in capsys.readouterr().err

    run_experiment(cfg, until="pool", force=True)  # redone from the current file
    assert read_json(stage_marker(run_dir, "pool"))["n_pool"] == 18


def test_another_folders_same_named_file_is_another_input_a_moved_copy_is_not(tmp_path: Path) -> None:
    a, b, moved = tmp_path / "a", tmp_path / "b", tmp_path / "moved"
    _alpaca(a / "pool.jsonl", 40)
    _alpaca(b / "pool.jsonl", 40, tag="other ")  # same name and rows, other content
    shutil.copytree(a, moved)
    runs = tmp_path / "runs"
    run_dir = run_experiment(_file_cfg(runs, a), until="pool")
    # Same config hash whatever data_dir says: where the data lives is not part of the run.
    assert _file_cfg(runs, b).run_dir() == _file_cfg(runs, moved).run_dir() == run_dir

    run_experiment(_file_cfg(runs, moved), until="pool")  # an identical file elsewhere: reused
    assert f"data_dir: {moved}" in (run_dir / "config.yaml").read_text()

    with pytest.raises(InputsChanged) as e:
        run_experiment(_file_cfg(runs, b), until="pool")
    msg = str(e.value)
    assert "pool.jsonl" in msg and "sha256" in msg and str(b / "pool.jsonl") in msg
    assert "rows" not in msg  # 40 rows both: only the content differs
    assert f"data_dir: {moved}" in (run_dir / "config.yaml").read_text()


def test_a_changed_model_directory_or_features_file_stops_the_rerun(tmp_path: Path) -> None:
    from repro.core.models import materialize_model

    model = tmp_path / "model"
    shutil.copytree(materialize_model(_cfg(tmp_path).model, 42), model)
    cfg = _cfg(tmp_path / "runs", f"model.name_or_path={model}", *DEMO, HELPER)
    run_dir = run_experiment(cfg, until="select")
    recorded = read_json(stage_marker(run_dir, "model"))["inputs"]["model"]["files"]
    assert "sha256" in recorded["config.json"] and "model.safetensors" in recorded

    np.save(run_dir / "features.npy", np.zeros((3, 4), np.float32))
    with pytest.raises(InputsChanged, match=r"select stage: features\.npy changed"):
        run_experiment(cfg, until="select")

    conf = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**conf, "rms_norm_eps": 1e-3}))
    with pytest.raises(InputsChanged, match=r"model stage: model file 'config\.json' changed"):
        run_experiment(cfg, until="select")


# ----------------------------------------------------------------------------- one writer


def _hold_lock(run_dir: Path, seconds: float) -> subprocess.Popen:
    """Another process holding the run folder's lock for `seconds` (returns once it holds it)."""
    code = (
        "import sys, time, pathlib\nfrom repro.core.rundir import run_lock\n"
        "with run_lock(pathlib.Path(sys.argv[1])):\n"
        "    print('held', flush=True)\n    time.sleep(float(sys.argv[2]))\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir), str(seconds)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_writer_stops_or_waits_and_a_killed_holder_frees_the_folder(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, *DEMO)
    run_dir = cfg.run_dir()
    holder = _hold_lock(run_dir, 600)
    try:
        with pytest.raises(RunLocked) as e:
            run_experiment(cfg, until="model")
        assert f"pid {holder.pid} on host {socket.gethostname()}" in str(e.value)
        assert not stage_marker(run_dir, "model").exists()
    finally:
        holder.send_signal(signal.SIGKILL)  # kill -9: as a preempted job is killed
        holder.wait()
    run_experiment(cfg, until="model")  # the kernel released the dead holder's lock

    holder = _hold_lock(run_dir, 2)
    t0 = time.monotonic()
    run_experiment(cfg, until="pool", wait_lock=True)
    assert time.monotonic() - t0 > 1.0 and holder.wait() == 0
    assert stage_marker(run_dir, "pool").is_file()


def test_a_run_killed_after_its_features_counts_them_and_locks_out_a_second_run(tmp_path: Path) -> None:
    """kill -9 of the run process itself, once the features are written: the rerun reuses them,
    and selection_s counts the killed attempt's seconds up to them; attempts = 2."""
    overrides = [
        f"output_dir={tmp_path / 'runs'}",
        *TINY,
        *DEMO,
        HELPER,
        "world_size=1",
        "train.global_batch_size=1",
        "train.max_steps=1",
    ]
    cfg = from_dict({}, overrides)
    run_dir = cfg.run_dir()
    hold = tmp_path / "hold"
    hold.mkdir()
    code = (
        "import sys\nfrom repro.core.config.load import from_dict\n"
        "from repro.pipeline import run_experiment\n"
        "run_experiment(from_dict({}, sys.argv[1:]), until='schedule')\n"
    )
    env = {**os.environ, "CLUSTER_REPRO_TEST_HOLD": str(hold), "CLUSTER_REPRO_TEST_KILL_AFTER_FEATURES": "1"}
    log = tmp_path / "first.log"
    with open(log, "w") as err:
        first = subprocess.Popen([sys.executable, "-c", code, *overrides], cwd=REPO, env=env, stderr=err)
    deadline = time.monotonic() + 300
    while not (hold / "inside").exists():  # the first run is computing its features
        assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    with pytest.raises(RunLocked, match=f"pid {first.pid}"):  # a second run of the same cell
        run_experiment(cfg)
    time.sleep(0.5)
    (hold / "release").touch()
    assert first.wait(timeout=300) == -signal.SIGKILL
    assert rundir._ledger(run_dir)["select"][-1]["status"] == "running"  # it died in there

    run_experiment(cfg)
    killed, done = rundir._ledger(run_dir)["select"]
    assert (killed["status"], done["status"]) == ("killed", "done")
    assert killed["progress"] == "features.json"
    assert 0.5 < killed["counted_s"] <= killed["ran_s"]  # it held 0.5 s before writing them
    sel, sch = (read_json(stage_marker(run_dir, s)) for s in ("select", "schedule"))
    assert sel["info"]["features_reused"] is True
    rows = read_rows(run_dir / PART_NAME)
    expected = killed["counted_s"] + sel["stage_s"] + sch["stage_s"]
    assert stage_seconds(run_dir, "select", sel) == pytest.approx(killed["counted_s"] + sel["stage_s"])
    for r in rows:
        assert float(r["selection_s"]) == pytest.approx(expected, abs=2e-3)
        assert float(r["selection_s"]) > killed["counted_s"]
        assert (r["attempts"], r["resumed_from_step"], r["status"]) == ("2", "0", "ok")
    e2e = float(rows[0]["end_to_end_s"])
    assert e2e >= expected + float(rows[0]["train_s"]) - 2e-3


# ----------------------------------------------------------------------------- divergence


def _merged_set(path: Path, fixture: Path, store: Path) -> Path:
    """One results set (the store's writer) of the report fixture's runs and the runs of `store`."""
    from repro.core.store import open_store, write_set

    entries = [json.loads(line) for line in fixture.with_name("results.runs.jsonl").read_text().splitlines()]
    for e in entries:  # the fixture's folders are relative to it
        e["folder"] = str(fixture.parent / e["folder"]) if e.get("folder") else None
    runs = open_store(store)
    rows = read_rows(fixture) + [r for _, r in runs.rows()]
    write_set(path, rows, entries + [r.index_entry() for r in runs.runs.values()])
    return path


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_diverging_training_stops_with_a_diverged_row(
    tmp_path: Path, strategy: str, capsys: pytest.CaptureFixture
) -> None:
    # The config guards reject train.lr=.inf, so divergence is forced with a huge finite lr:
    # plain SGD at 1e30 on full fine-tuning sends the weights past float32 after the first step,
    # so step 1's loss (0-based) is NaN on every worker.
    cfg = _cfg(
        tmp_path / "runs",
        *DEMO,
        f"train.strategy={strategy}",
        "model.lora.enabled=false",
        "train.optimizer=sgd",
        "train.lr=1e30",
        "train.schedule=constant",
        "train.max_steps=3",
    )
    with pytest.raises(TrainingDiverged) as e:
        run_experiment(cfg)
    assert "diverged at step 1 of 3" in str(e.value) and "non-finite loss" in str(e.value)
    run_dir = cfg.run_dir()
    train = read_json(run_dir / "train.json")
    assert (train["status"], train["diverged_step"], train["steps_run"]) == ("diverged", 1, 1)
    assert train["diverged"]["loss"] == ["nan", "nan"]
    assert not (run_dir / "model").exists() and not stage_marker(run_dir, "eval").exists()
    rows = read_rows(run_dir / PART_NAME)
    assert {r["status"] for r in rows} == {"diverged"}
    (div,) = [r for r in rows if r["metric"] == "diverged"]
    assert (div["benchmark"], div["value"], div["n"], div["eval_s"]) == ("train", "1", "3", "")
    assert not [r for r in rows if r["benchmark"] == "heldout"]  # no scores from NaN weights
    harness = read_json(run_dir / "lm_eval_results.json")  # lm-eval's shape: no results either
    assert harness["results"] == {} and harness["cluster_repro"]["status"] == "diverged"
    if strategy == "fsdp":
        return

    # A rerun says so again without training again; on the command line: exit status 3.
    assert _cli(cfg, tmp_path, "run") == 3
    assert "diverged at step 1" in capsys.readouterr().err
    assert read_json(run_dir / "train.json")["steps_run"] == 1

    # The report shows the cell as diverged, never as missing.
    from reports.build import build_report

    fixture = REPO / "tests" / "data" / "reports" / "results.csv"
    src = _merged_set(tmp_path / "results.csv", fixture, tmp_path / "runs")
    build_report(src, tmp_path / "report", figures=False)
    with open(tmp_path / "report" / "tables" / "main.csv", newline="") as fh:
        (ours,) = [r for r in csv.DictReader(fh) if r["method"] == "full" and r["workers"] == "2"]
    quality = [
        v
        for k, v in ours.items()  # (not the interval columns [low], [high], [n])
        if k.startswith(("heldout", "demo")) and not k.endswith("]")
    ]
    assert quality and set(quality) == {"diverged"}
    md = (tmp_path / "report" / "tables" / "main.md").read_text()
    assert "| diverged |" in md


# ----------------------------------------------------------------------------- selection's clock


def test_the_select_stage_clock_starts_after_the_process_start_up(tmp_path: Path) -> None:
    """In a fresh process (as `track run`'s first run, or one SLURM job), the libraries the
    suite's selectors import on first use and the workers' fork server are ready before the
    selector is called: its seconds, which compute matching buys random data with, are the same
    whether or not the run is its process's first (the first used to count about 4 s more)."""
    cfg = _cfg(tmp_path / "runs", *DEMO, "selection.method=tests.run_safety_helpers:SeesStartUp")
    path = tmp_path / "cfg.yaml"
    save_config(cfg, path)
    code = "import sys; from repro.cli import main; sys.exit(main(['run', sys.argv[1]]))"
    run = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, capture_output=True, text=True)
    assert run.returncode != 0 and "SeesStartUp stops here" in run.stderr
    # The start-up is paid before the stage's clock starts: the rows' selection_s is the stage's time.
    log = run.stderr
    assert "select: start-up" in log and log.index("select: start-up") < log.index("select: running")
    seen = read_json(cfg.run_dir() / "start_up.json")
    assert seen == {
        "imported": ["sklearn.cluster", "transformers.models.llama.modeling_llama"],
        "fork_server_up": True,
    }
