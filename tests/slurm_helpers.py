"""What the tests that submit to a REAL SLURM share: the cluster fixtures and the CLI helpers.

`slurm_cluster` (session) uses the project's one-node cluster when it is up (CI starts it in
.ci/run), or starts it with slurm/local/start.sh (root; installs Debian's packages if missing)
and stops what it started once the last test process using it ends: under `make test` several
xdist workers share it, so starting is done under a file lock and each worker leaves a mark of
its pid. Without a cluster and without the means to start one the tests FAIL with the reason;
they never skip. Cells use the tiny random model, so each job is seconds of work.

`two_node_cluster` starts a second, private cluster of 2 nodes on this host (two slurmd,
`CLUSTER_REPRO_SLURM_NODES=2`, its own folder, ports and munged) and stops it afterwards.

The fixtures are made visible to every test file by tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from repro.core.io import file_lock, read_json

# Not imported from tests/conftest.py, which imports this module's fixtures.
REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"

SLURM_DIR = Path(os.environ.get("CLUSTER_REPRO_SLURM_DIR", "/tmp/cluster-repro-slurm"))
PROFILE = str(CONFIGS / "clusters" / "local.yaml")
# The start of an experiment file on the quick demo's config: its grid's one model, the tiny one.
QUICK = f"base: {(CONFIGS / 'demo-quick.yaml').as_posix()}\ngrid:\n  models: {{tiny: {{}}}}\n"


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """The one-node local cluster's slurm.conf (also set as SLURM_CONF): the running cluster, or
    one these tests start, and stop after the last test process that uses it."""
    conf = SLURM_DIR / "etc" / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": os.environ["PATH"] + ":/usr/sbin:/sbin"}
    # Beside the cluster's folder, shared by the test processes of one host.
    lock = Path(f"{SLURM_DIR}.tests.lock")
    record = Path(f"{SLURM_DIR}.tests.started")  # what the tests started (start.sh writes it)
    users = Path(f"{SLURM_DIR}.tests.users")  # one file per test process using the cluster
    with file_lock(lock):
        if not (conf.is_file() and _up(env)):
            if os.geteuid() != 0:
                pytest.fail(
                    "no local SLURM is running and these tests are not root, so they cannot "
                    "start one: run `sudo bash slurm/local/start.sh` first (see docs/slurm.md)"
                )
            p = subprocess.run(
                ["bash", str(REPO / "slurm" / "local" / "start.sh")],
                # 12 fake GPUs, as CI's cluster: the test files' 4-GPU jobs run side by side.
                env={**env, "CLUSTER_REPRO_SLURM_RECORD": str(record), "CLUSTER_REPRO_SLURM_GPUS": "12"},
                capture_output=True,
                text=True,
                timeout=900,
            )
            if p.returncode != 0 or not _up(env):
                pytest.fail(
                    "could not start the local SLURM with slurm/local/start.sh "
                    f"(exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
                )
        users.mkdir(exist_ok=True)
        (users / str(os.getpid())).touch()
    os.environ["SLURM_CONF"] = str(conf)
    yield conf
    with file_lock(lock):
        (users / str(os.getpid())).unlink(missing_ok=True)
        others = [p for p in users.iterdir() if p.name.isdigit() and _alive(int(p.name))]
        if not others and record.is_file():
            subprocess.run(
                ["bash", str(REPO / "slurm" / "local" / "stop.sh")],
                env={**env, "CLUSTER_REPRO_SLURM_RECORD": str(record)},
                timeout=120,
            )
            record.unlink(missing_ok=True)


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
    return ["launch", str(grid), "--cluster", "slurm", "--profile", PROFILE, "--results", str(out), *extra]


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
    p = cli("status", str(grid), "--results", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {}
    for line in p.stdout.splitlines()[:-1]:
        cell, *rest = line.split()
        rows[cell] = rest
    return rows


def run_dir_of(out: Path, cell: str) -> Path:
    (d,) = [p for p in (out / cell).iterdir() if p.is_dir()]
    return d


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
