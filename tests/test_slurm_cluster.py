"""The launcher through a REAL SLURM: sbatch, srun tasks, job arrays, dependencies, sacct.

A session fixture uses the project's one-node cluster when it is up (CI starts it in .ci/run),
or starts it with slurm/local/start.sh (root; installs Debian's packages if missing) and stops
what it started afterwards. Without a cluster and without the means to start one the tests FAIL
with the reason; they never skip. Cells use the tiny random model, so each job is seconds of work.

The multi-node test starts a second, private cluster of 2 nodes on this host (two slurmd,
`CLUSTER_REPRO_SLURM_NODES=2`, its own folder, ports and munged) and stops it afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from repro.core.distributed import master_port_for_job
from repro.core.io import read_json
from slurm.launcher import make_executor
from slurm.profile import load_profile
from tests.conftest import CONFIGS, REPO
from tests.crash_hook import crash_env

SLURM_DIR = Path(os.environ.get("CLUSTER_REPRO_SLURM_DIR", "/tmp/cluster-repro-slurm"))
PROFILE = str(CONFIGS / "clusters" / "local.yaml")
QUICK = f"base: {(CONFIGS / 'demo-quick.yaml').as_posix()}\nmodels: {{tiny: {{}}}}\n"


def _up(env: dict[str, str]) -> bool:
    try:
        ping = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=20)
        node = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=20
        )
        acct = subprocess.run(
            ["sacct", "-n", "-X", "-S", "now"], env=env, capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return (
        "UP" in ping.stdout
        and node.stdout.strip().startswith(("idle", "mixed", "alloc"))
        and acct.returncode == 0
    )


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    conf = SLURM_DIR / "etc" / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": os.environ["PATH"] + ":/usr/sbin:/sbin"}
    record = None
    if not (conf.is_file() and _up(env)):
        if os.geteuid() != 0:
            pytest.fail(
                "no local SLURM is running and these tests are not root, so they cannot "
                "start one: run `sudo bash slurm/local/start.sh` first (see docs/slurm.md)"
            )
        record = tmp_path_factory.mktemp("slurm") / "started"
        p = subprocess.run(
            ["bash", str(REPO / "slurm" / "local" / "start.sh")],
            env={**env, "CLUSTER_REPRO_SLURM_RECORD": str(record)},
            capture_output=True,
            text=True,
            timeout=900,
        )
        if p.returncode != 0 or not _up(env):
            pytest.fail(
                "could not start the local SLURM with slurm/local/start.sh "
                f"(exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            )
    os.environ["SLURM_CONF"] = str(conf)
    yield conf
    if record is not None:
        subprocess.run(
            ["bash", str(REPO / "slurm" / "local" / "stop.sh")],
            env={**env, "CLUSTER_REPRO_SLURM_RECORD": str(record)},
            timeout=120,
        )


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def two_node_cluster() -> dict[str, str]:
    """A private 2-node SLURM (nodes 127.0.0.1 and 127.0.0.2, 4 fake GPUs each) beside any other
    cluster on this host: its own folder, munged, database and ports. Yields the variables that
    point clients at it; stops exactly what it started, and deletes its folder, afterwards."""
    if os.geteuid() != 0:
        pytest.fail("the 2-node test starts its own SLURM daemons and needs root (see docs/slurm.md)")
    # Under /tmp, world-traversable: munged and mariadbd run as their own users.
    d = Path(tempfile.mkdtemp(prefix="cluster-repro-2nodes-", dir="/tmp"))
    d.chmod(0o755)
    # slurmctld PORT, slurmd PORT+1 and PORT+3, slurmdbd PORT+2 (start.sh); then the database's.
    base = next(b for b in range(7017, 9000, 10) if all(_free(b + k) for k in range(4)))
    db = next(p for p in range(base + 5, base + 100) if _free(p))
    env = {
        **os.environ,
        "PATH": os.environ["PATH"] + ":/usr/sbin:/sbin",
        "CLUSTER_REPRO_SLURM_DIR": str(d),
        "CLUSTER_REPRO_SLURM_NODES": "2",
        "CLUSTER_REPRO_SLURM_PORT": str(base),
        "CLUSTER_REPRO_SLURM_DB_PORT": str(db),
        "CLUSTER_REPRO_SLURM_RECORD": str(d / "started"),
        "SLURM_CONF": str(d / "etc" / "slurm.conf"),
    }
    try:
        p = subprocess.run(
            ["bash", str(REPO / "slurm" / "local" / "start.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert p.returncode == 0, (
            "slurm/local/start.sh could not start 2 nodes (exit "
            f"{p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        )
        yield {"SLURM_CONF": env["SLURM_CONF"], "log_dir": str(d / "log")}
    finally:
        subprocess.run(
            ["bash", str(REPO / "slurm" / "local" / "stop.sh")], env=env, timeout=120, capture_output=True
        )
        shutil.rmtree(d, ignore_errors=True)


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "repro", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def launch_args(grid: Path | str, out: Path, *extra: str) -> list[str]:
    """`launch` of `grid` on this SLURM cluster (PROFILE) into `out`, then `extra`."""
    return ["launch", str(grid), "--cluster", "slurm", "--profile", PROFILE, "--output-dir", str(out), *extra]


def launch(
    grid: Path | str, out: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 540
) -> subprocess.CompletedProcess:
    return cli(*launch_args(grid, out, *extra), env=env, timeout=timeout)


def sacct(job_id: str, fields: str = "JobID,State,NTasks,AllocTRES") -> list[dict[str, str]]:
    """Accounting rows of a job (allocation first, then steps), once its state is final: a job
    can still be COMPLETING for a moment after its result file is written."""
    names = fields.split(",")
    t0 = time.monotonic()
    while True:
        p = subprocess.run(
            ["sacct", "-P", "-n", "-j", job_id, "-o", fields], capture_output=True, text=True, timeout=30
        )
        rows = [dict(zip(names, line.split("|"))) for line in p.stdout.splitlines() if line]
        if (
            "State" not in names
            or (
                rows
                and all(
                    r["State"].split()[0] not in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED")
                    for r in rows
                )
            )
            or time.monotonic() - t0 > 60
        ):
            return rows
        time.sleep(0.5)


def status(grid: Path | str, out: Path) -> dict[str, list[str]]:
    p = cli("status", str(grid), "--output-dir", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {}
    for line in p.stdout.splitlines()[:-1]:
        cell, *rest = line.split()
        rows[cell] = rest
    return rows


def run_dir_of(out: Path, cell: str) -> Path:
    (d,) = [p for p in (out / cell).iterdir() if p.is_dir()]
    return d


def test_eight_tasks_on_two_nodes_join_one_group_from_slurm_variables(
    two_node_cluster: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The paper's scaling-run shape, 8 workers on 2 nodes of 4 GPUs, through the launcher's own
    executor: each task joins real torch.distributed (gloo) from SLURM's variables alone."""
    from slurm.jobs import rendezvous_probe

    monkeypatch.setenv("SLURM_CONF", two_node_cluster["SLURM_CONF"])  # submitit's sbatch/sacct
    prof = load_profile(PROFILE)  # gpus_per_node 4: 8 workers ask for 2 whole nodes
    ex = make_executor("slurm", tmp_path / "submitit", prof, 8, "two-nodes")
    job = ex.submit(rendezvous_probe)
    t0 = time.monotonic()
    while not job.done() and time.monotonic() - t0 < 150:
        time.sleep(1)
    assert job.done(), f"the 2-node job {job.job_id} did not end in 150 s: {job.state}"
    res = sorted(job.results(), key=lambda r: r["rank"])
    nodes = ["127.0.0.1", "127.0.0.2"]  # the cluster's node list, 127.0.0.[1-2]
    assert [r["rank"] for r in res] == list(range(8)) and {r["world_size"] for r in res} == {8}
    assert {r["source"] for r in res} == {"slurm"}  # no torchrun variables involved
    # Ranks 0-3 on the first node, 4-7 on the second; local ranks 0-3 on each, one GPU each.
    assert [r["node"] for r in res] == [nodes[0]] * 4 + [nodes[1]] * 4
    assert [r["local_rank"] for r in res] == [0, 1, 2, 3] * 2
    assert [r["cuda_device"] for r in res] == [0, 1, 2, 3] * 2
    # One master for all: the first node of the list, at the port derived from the job id.
    assert {(r["master_addr"], r["master_port"]) for r in res} == {
        (nodes[0], master_port_for_job(job.job_id))
    }
    # The collectives crossed the nodes: the sum of rank + 1, and every task's node, everywhere.
    assert {r["sum"] for r in res} == {36.0}
    assert all(r["nodes"] == [nodes[0]] * 4 + [nodes[1]] * 4 for r in res)
    alloc = sacct(job.job_id, "JobID,State,NNodes,NodeList,NTasks,AllocTRES")
    assert alloc[0]["State"] == "COMPLETED" and alloc[0]["NNodes"] == "2", alloc
    assert alloc[0]["NodeList"] == "127.0.0.[1-2]" and "gres/gpu=8" in alloc[0]["AllocTRES"], alloc
    assert any(s["JobID"].endswith(".0") and s["NTasks"] == "8" for s in alloc), alloc


def test_quick_demo_grid_runs_with_four_slurm_tasks_per_cell(slurm_cluster: Path, tmp_path: Path) -> None:
    grid = CONFIGS / "grids" / "demo-quick.yaml"
    p = launch(grid, tmp_path, "--wait")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    record = read_json(tmp_path / "_launch" / "demo-quick" / "jobs.json")
    jobs = record["jobs"]
    (feat,) = [n for n in jobs if n.startswith("features-")]
    cells = ["demo.tiny.full.ws4.s42", "demo.tiny.cluster-r50.ws4.s42", "demo.tiny.random-r50.ws4.s42"]
    assert set(jobs) == {feat, *cells}
    # CluSTER and the random baseline at its kept count went out as one array (one sbatch, its
    # tasks numbered from 0), after the features.
    arr = {jobs[c]["job_id"].split("_")[0] for c in cells[1:]}
    assert len(arr) == 1 and all("_" in jobs[c]["job_id"] for c in cells[1:])
    (base,) = arr
    assert sorted(jobs[c]["job_id"] for c in cells[1:]) == [f"{base}_{k}" for k in range(2)]
    tasks = [s for s in sacct(base, "JobID,State") if "." not in s["JobID"]]
    assert sorted(s["JobID"] for s in tasks) == [f"{base}_{k}" for k in range(2)]
    assert {s["State"] for s in tasks} == {"COMPLETED"}
    assert jobs[cells[1]]["after"] == jobs[feat]["job_id"] and jobs[cells[0]]["after"] is None
    # Each cell was one SLURM job of 4 tasks holding the node's 4 (fake) GPUs.
    for c in cells:
        steps = sacct(jobs[c]["job_id"])
        assert steps[0]["State"] == "COMPLETED", steps
        assert "gres/gpu=4" in steps[0]["AllocTRES"]
        assert any(s["JobID"].endswith(".0") and s["NTasks"] == "4" for s in steps), steps
        folder = Path(jobs[c]["stdout"]).parent
        jid = jobs[c]["job_id"]
        assert all((folder / f"{jid}_{t}_log.out").is_file() for t in range(4))

    runs = {c: run_dir_of(tmp_path, c) for c in cells}
    for c, d in runs.items():
        assert (d / "stages" / "results.json").is_file(), c
        assert sorted(p.name for p in (d / "train_log").iterdir()) == [f"rank{k}.jsonl" for k in range(4)]
    # The features were computed once, in the shared folder, and linked into the CluSTER run.
    shared = tmp_path / "_shared" / "features" / feat.removeprefix("features-")
    assert (runs[cells[1]] / "features.npy").stat().st_ino == (shared / "features.npy").stat().st_ino
    assert not (runs[cells[0]] / "features.npy").exists()
    sel_c = read_json(runs[cells[1]] / "stages" / "select.json")
    sel_r = read_json(runs[cells[2]] / "stages" / "select.json")
    assert sel_r["method"] == "random" and sel_r["n_selected"] == sel_c["n_unique"] < sel_c["n_pool"]

    st = status(grid, tmp_path)
    assert {c: st[c][0] for c in cells} == dict.fromkeys(cells, "done")
    again = launch(grid, tmp_path)
    assert again.returncode == 0 and "nothing to submit: 3 cells done" in again.stdout
    assert again.stderr.count("done already, skipped") == 3


def launch_until_running(grid: Path, out: Path, name: str, cell: str) -> tuple[subprocess.Popen, str, Path]:
    """Start `launch --wait` in the background and return once the cell's job runs (rank 0
    writes its state file first): the launcher process, the job id and the state file."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "repro", *launch_args(grid, out, "--wait")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    state = out / "_launch" / name / "state" / f"{cell}.json"
    t0 = time.monotonic()
    while not state.is_file():
        assert time.monotonic() - t0 < 120 and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    return proc, read_json(out / "_launch" / name / "jobs.json")["jobs"][cell]["job_id"], state


def test_cancelled_job_is_reported_failed_not_waited_on(slurm_cluster: Path, tmp_path: Path) -> None:
    grid = tmp_path / "cancel.yaml"
    grid.write_text(
        QUICK
        + """name: cancel
datasets: {demo: {}}
methods: {full: {overrides: [selection.method=full]}}
world_sizes: [1]
seeds: [5]
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
        + """name: resume
datasets: {demo: {overrides: [train.checkpoint_every=2, eval.demo_tasks=false]}}
methods: {full: {overrides: [selection.method=full]}}
world_sizes: [2]
seeds: [7]
"""
    )
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
    assert train["resumed_from_step"] == 2
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
        + """name: preempt
datasets: {demo: {overrides: [eval.demo_tasks=false]}}
methods: {full: {overrides: [selection.method=full]}}
world_sizes: [1]
seeds: [9]
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
