"""Jobs that do not end well, through a REAL SLURM: a cancelled job is reported failed at once,
a killed job's cell resumes from its checkpoint when launched again, a preempted job requeues
itself. The cluster comes from tests/slurm_helpers.py (the fixture `slurm_cluster`)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from repro.core.io import read_json
from tests.crash_hook import crash_env
from tests.slurm_helpers import QUICK, launch, launch_until_running, run_dir_of, sacct, status


def test_cancelled_job_is_reported_failed_not_waited_on(slurm_cluster: Path, tmp_path: Path) -> None:
    grid = tmp_path / "cancel.yaml"
    grid.write_text(
        QUICK
        + """  datasets: {demo: {}}
  methods: {full: {overrides: [selection.method=full]}}
  world_sizes: [1]
  seeds: [5]
name: cancel
"""
    )
    out = tmp_path / "runs"
    cell = "demo.tiny.full.ws1.s5"
    proc, job_id, _ = launch_until_running(grid, out, "cancel", cell)
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    t_cancel = time.monotonic()
    stdout, stderr = proc.communicate(timeout=180)
    waited = time.monotonic() - t_cancel
    assert proc.returncode == 1, stdout + stderr[-3000:]
    assert f"{cell}: failed: UncompletedJobError" in stdout
    assert waited < 120, f"the launcher took {waited:.0f} s to notice the cancelled job"
    st = status(grid, out)[cell]
    assert st[0] == "failed" and st[1:3] == ["job", job_id]
    log = st[st.index("log:") + 1]
    assert log.endswith(f"{job_id}_0_log.err") and "CANCELLED" in " ".join(st)


def test_killed_job_relaunched_resumes_from_its_checkpoint(slurm_cluster: Path, tmp_path: Path) -> None:
    grid = tmp_path / "resume.yaml"
    grid.write_text(
        QUICK
        + """  datasets:
    demo: {overrides: [train.checkpoint_every=2, train.max_steps=6, "eval.benchmarks=[]"]}
  methods: {full: {overrides: [selection.method=full]}}
  world_sizes: [2]
  seeds: [7]
name: resume
"""
    )  # 6 steps (of the pool's 24): killed after 3, resumed from 2, so the second job runs 4
    out = tmp_path / "runs"
    cell = "demo.tiny.full.ws2.s7"
    # Every worker of the first job dies hard (os._exit(137), as under kill -9) after step 3
    # (tests/crash_hook, on the PYTHONPATH the job's tasks inherit).
    first = launch(grid, out, "--wait", env=crash_env(3))
    assert first.returncode == 1, first.stdout[-2000:] + first.stderr[-3000:]
    jobs = read_json(out / "_launch" / "resume" / "jobs.json")["jobs"]
    first_id = jobs[cell]["job_id"]
    assert sacct(first_id, "JobID,State")[0]["State"] == "FAILED"
    st = status(grid, out)[cell]
    assert st[0] == "failed" and Path(st[st.index("log:") + 1]).is_file()
    run = run_dir_of(out, cell)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-0000002"]
    assert not (run / "train.json").exists()

    second = launch(grid, out, "--wait")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    train = read_json(run / "train.json")
    assert train["resumed_from_step"] == 2 and train["total_steps"] == 6
    assert train["steps_run"] == train["total_steps"] - 2
    steps = [json.loads(x)["step"] for x in (run / "train_log" / "rank1.jsonl").read_text().splitlines()]
    assert steps == list(range(train["total_steps"]))  # no step lost or repeated in the log
    assert status(grid, out)[cell][0] == "done"
    assert read_json(out / "_launch" / "resume" / "jobs.json")["jobs"][cell]["job_id"] != first_id


# Slow: SLURM holds a requeued job for about two minutes before it is eligible again (measured
# here: requeue 11:38:00, eligible 11:39:58). The required tests do not include it.
@pytest.mark.slow
def test_preempted_job_requeues_itself_and_finishes(slurm_cluster: Path, tmp_path: Path) -> None:
    grid = tmp_path / "preempt.yaml"
    grid.write_text(
        QUICK
        + """  datasets: {demo: {overrides: ["eval.benchmarks=[]"]}}
  methods: {full: {overrides: [selection.method=full]}}
  world_sizes: [1]
  seeds: [9]
name: preempt
"""
    )
    out = tmp_path / "runs"
    cell = "demo.tiny.full.ws1.s9"
    # Once the cell runs, submitit's signal handlers are in place.
    proc, job_id, state = launch_until_running(grid, out, "preempt", cell)
    # What SLURM sends before a time limit or on preemption: rank 0 requeues the job.
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode == 0, stdout + stderr[-3000:]
    final = read_json(state)
    assert final["state"] == "done" and final["restart"] >= 1 and final["job_id"] == job_id
    log = Path(read_json(out / "_launch" / "preempt" / "jobs.json")["jobs"][cell]["stderr"])
    assert "Requeued job" in log.read_text() or "requeueing" in log.read_text()
    assert status(grid, out)[cell][0] == "done"
