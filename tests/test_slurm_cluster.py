"""The launcher through a REAL SLURM: sbatch, srun tasks, job arrays, dependencies, sacct.

The clusters (the project's one-node cluster, and a private 2-node one) come from the fixtures
of tests/slurm_helpers.py; without a cluster and without the means to start one the tests FAIL
with the reason, they never skip. Cells use the tiny random model, so each job is seconds of
work. Jobs that fail, are cancelled, killed or preempted: tests/test_slurm_resume.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from repro.core.distributed import master_port_for_job
from repro.core.io import read_json
from slurm.executors import make_executor
from slurm.profile import load_profile
from tests.conftest import CONFIGS
from tests.slurm_helpers import PROFILE, launch, run_dir_of, sacct, status


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


def test_quick_demo_grid_runs_as_a_features_job_and_two_task_cells(slurm_cluster: Path, tmp_path: Path):
    """The shipped quick grid (full, CluSTER r = 0.5, random at CluSTER's kept count) at world
    size 2 instead of its 4: 2 SLURM tasks per cell exercise every rank-0 / other-rank path of a
    cell job, with 7 task processes instead of 13 (each pays ~8 CPU-s of imports on 2 cores;
    docs/measurements.md, "The suite under 12 minutes"). 8 tasks in one group, on 2 nodes of 4
    GPUs: the test above."""
    shipped = (CONFIGS / "experiments" / "demo-quick.yaml").read_text()
    assert "world_sizes: [4]" in shipped and "base: ../demo-quick.yaml" in shipped
    grid = tmp_path / "demo-quick.yaml"
    grid.write_text(
        shipped.replace("world_sizes: [4]", "world_sizes: [2]").replace(
            "base: ../demo-quick.yaml", f"base: {(CONFIGS / 'demo-quick.yaml').as_posix()}"
        )
    )
    p = launch(grid, tmp_path, "--wait")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    record = read_json(tmp_path / "_launch" / "demo-quick" / "jobs.json")
    jobs = record["jobs"]
    (feat,) = [n for n in jobs if n.startswith("features-")]
    cells = ["demo.tiny.full.ws2.s42", "demo.tiny.cluster-r50.ws2.s42", "demo.tiny.random-r50.ws2.s42"]
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
    # Each cell was one SLURM job of 2 tasks holding 2 (fake) GPUs, one per task.
    for c in cells:
        steps = sacct(jobs[c]["job_id"])
        assert steps[0]["State"] == "COMPLETED", steps
        assert "gres/gpu=2" in steps[0]["AllocTRES"]
        assert any(s["JobID"].endswith(".0") and s["NTasks"] == "2" for s in steps), steps
        folder = Path(jobs[c]["stdout"]).parent
        jid = jobs[c]["job_id"]
        assert all((folder / f"{jid}_{t}_log.out").is_file() for t in range(2))

    runs = {c: run_dir_of(tmp_path, c) for c in cells}
    for c, d in runs.items():
        assert (d / "stages" / "results.json").is_file(), c
        assert sorted(p.name for p in (d / "train_log").iterdir()) == [f"rank{k}.jsonl" for k in range(2)]
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
