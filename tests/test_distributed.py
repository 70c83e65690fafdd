"""The rendezvous from SLURM's and torchrun's variables (repro/core/distributed.py), in isolation.

What SLURM sets in each task of a 2-node x 4-task allocation is written out here as SLURM 22.05
sets it (seen in `srun` tasks of the 2-node local cluster); tests/test_slurm_cluster.py runs the
same path through a real 2-node SLURM with real gloo. No process group is started here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from repro.core.distributed import (
    PORT_BASE,
    PORT_SPAN,
    cuda_device_index,
    env_rank_world,
    expand_hostlist,
    init_from_env,
    launch_env,
    launched_group,
    master_port_for_job,
    run_group,
    slurm_env,
)
from repro.experiments.experiment import load_experiment
from slurm.executors import sbatch_script, slurm_parameters
from slurm.jobs import export_torch_env
from slurm.profile import load_profile
from tests.conftest import CONFIGS, LAUNCH_VARS


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """os.environ without any launcher variable (the test process may run inside a SLURM job)."""
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def srun_task(
    rank: int, nodes: str = "gpu[07-08]", per_node: int = 4, n_nodes: int = 2, job_id: str = "4242"
) -> dict[str, str]:
    """The variables srun gives task `rank` of a block-distributed nodes x per_node step."""
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % per_node),
        "SLURM_NODEID": str(rank // per_node),
        "SLURM_NTASKS": str(per_node * n_nodes),
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_NODELIST": nodes,
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{n_nodes})",
    }


# ----------------------------------------------------------------------------- node lists


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("gpu[01-02,07],cpu-a3", ["gpu01", "gpu02", "gpu07", "cpu-a3"]),
        ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
        ("node7", ["node7"]),
        ("n[8-10]", ["n8", "n9", "n10"]),  # no padding: widths grow
        ("n[08-10]", ["n08", "n09", "n10"]),  # padding from the lower bound
        ("a[1-2]-ib,b3", ["a1-ib", "a2-ib", "b3"]),  # text after the brackets
        ("r[1-2]n[0-1]", ["r1n0", "r1n1", "r2n0", "r2n1"]),  # two groups: the product
        (" x[3,1] ", ["x3", "x1"]),  # SLURM's order is kept
    ],
)
def test_expand_hostlist(nodelist: str, hosts: list[str]) -> None:
    assert expand_hostlist(nodelist) == hosts


@pytest.mark.parametrize(
    "nodelist, message",
    [
        ("", "empty host name"),
        ("a,,b", "empty host name"),
        ("gpu[1-2", "unbalanced brackets"),
        ("gpu1-2]", "unbalanced brackets"),
        ("gpu[2-1]", "runs backwards"),
        ("gpu[a-b]", "expected a number or a range"),
        ("gpu[]", "expected a number or a range"),
        ("gpu[[1]]", "without its ']'"),
    ],
)
def test_expand_hostlist_names_the_list_in_errors(nodelist: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        expand_hostlist(nodelist)
    assert repr(nodelist) in str(e.value)


def test_master_port_is_a_function_of_the_job_id() -> None:
    ports = [master_port_for_job(str(j)) for j in range(1000, 1100)]
    assert ports == [master_port_for_job(j) for j in range(1000, 1100)]  # str or int, same port
    assert len(set(ports)) == 100  # consecutive jobs sharing a node never collide
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN < 32768 for p in ports)  # not ephemeral
    arr = master_port_for_job("1234_5")  # submitit's id of an array task
    assert arr == master_port_for_job("1234_5") != master_port_for_job("1234_6")
    assert PORT_BASE <= arr < PORT_BASE + PORT_SPAN


# ----------------------------------------------------------------------------- a 2-node allocation


def test_two_nodes_of_four_tasks_map_to_one_group() -> None:
    envs = [slurm_env(srun_task(r)) for r in range(8)]
    assert [e.rank for e in envs] == list(range(8))
    assert {e.world_size for e in envs} == {8}
    assert [e.local_rank for e in envs] == [0, 1, 2, 3, 0, 1, 2, 3]
    # Every task agrees on the rendezvous without talking: rank 0's node, the job's port.
    assert {(e.master_addr, e.master_port) for e in envs} == {("gpu07", PORT_BASE + 4242)}
    assert {e.source for e in envs} == {"slurm"}
    # Each node's 4 tasks see the node's 4 GPUs (--gpus-per-node=4) and take one each.
    assert [cuda_device_index(e.local_rank, 4) for e in envs] == [0, 1, 2, 3, 0, 1, 2, 3]
    # A task bound to one GPU of its own (--gpus-per-task=1) sees only that one.
    assert {cuda_device_index(e.local_rank, 1) for e in envs} == {0}
    assert envs[5].torch_vars() == {
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(PORT_BASE + 4242),
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
    }


def test_the_step_node_list_wins_and_the_job_list_is_the_fallback() -> None:
    # A step on part of the allocation: its rank 0 runs on the step's first node.
    env = {**srun_task(0, nodes="cn[1-4]"), "SLURM_STEP_NODELIST": "cn[3-4]"}
    assert slurm_env(env).master_addr == "cn3"
    env = {k: v for k, v in srun_task(0, nodes="cn[1-4]").items() if k != "SLURM_STEP_NODELIST"}
    assert slurm_env(env).master_addr == "cn1"
    env = {k: v for k, v in env.items() if k != "SLURM_JOB_NODELIST"}
    assert slurm_env(env).master_addr == "cn1"  # SLURM_NODELIST, the older name


def test_master_addr_and_port_set_by_the_user_win() -> None:
    env = {**srun_task(3), "MASTER_PORT": "23456", "MASTER_ADDR": "gpu07-ib"}
    e = slurm_env(env)
    assert (e.master_addr, e.master_port, e.rank) == ("gpu07-ib", 23456, 3)


def test_torchrun_variables_win_over_slurm() -> None:
    env = {
        **srun_task(6),
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29400",
    }
    e = launch_env(env)
    assert (e.rank, e.world_size, e.local_rank, e.master_addr, e.master_port, e.source) == (
        1,
        2,
        1,
        "10.0.0.5",
        29400,
        "torchrun",
    )
    # torchrun's defaults: local rank = rank, 127.0.0.1:29500.
    e = launch_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert (e.local_rank, e.master_addr, e.master_port) == (0, "127.0.0.1", 29500)


def test_a_batch_script_is_not_a_rank() -> None:
    # sbatch's script sees the allocation's SLURM_PROCID=0 and SLURM_NTASKS=8 but is one process:
    # only srun's tasks (SLURM_STEP_ID set) are ranks.
    batch = {k: v for k, v in srun_task(0).items() if k != "SLURM_STEP_ID"}
    assert slurm_env(batch) is None and launch_env(batch) is None
    assert launch_env({}) is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_PROCID": "one"}, "SLURM_PROCID='one' is not a whole number"),
        ({"SLURM_PROCID": "8"}, "rank 8, world size 8"),
        (
            {"SLURM_JOB_NODELIST": "gpu[07-", "SLURM_STEP_NODELIST": "gpu[07-"},
            "SLURM_STEP_NODELIST: node list 'gpu\\[07-': unbalanced",
        ),
        ({"MASTER_PORT": "70000"}, "port 70000 is not a TCP port"),
    ],
)
def test_bad_slurm_variables_are_named(change: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        slurm_env({**srun_task(0), **change})


def test_a_task_without_node_list_or_job_id_is_an_error() -> None:
    env = {k: v for k, v in srun_task(0).items() if not k.endswith("NODELIST")}
    with pytest.raises(ValueError, match="without a node list"):
        slurm_env(env)
    env = {k: v for k, v in srun_task(0).items() if k != "SLURM_JOB_ID"}
    with pytest.raises(ValueError, match="without SLURM_JOB_ID"):
        slurm_env(env)


def test_cuda_device_index_refuses_two_workers_on_one_gpu() -> None:
    assert cuda_device_index(3, 4) == 3 and cuda_device_index(0, 8) == 0
    with pytest.raises(ValueError, match="local rank 2 needs a CUDA device of its own, but only 2"):
        cuda_device_index(2, 2)
    with pytest.raises(ValueError, match="no CUDA device"):
        cuda_device_index(0, 0)


def test_env_rank_world_and_init_from_env_read_the_process_environment(clean_env: pytest.MonkeyPatch) -> None:
    assert env_rank_world() is None
    with pytest.raises(RuntimeError, match="not launched by torchrun or srun"):
        init_from_env()
    for k, v in srun_task(6).items():
        clean_env.setenv(k, v)
    assert env_rank_world() == (6, 8, 2)


def test_a_launched_group_is_joined_only_at_the_size_asked_for(clean_env: pytest.MonkeyPatch) -> None:
    """run_group's choice (repro/core/distributed.py), without starting a group: a task of an
    8-task srun step joins a group of 8 or of any size, never one of 4 (the trainer's and the eval
    stage's rule: the job's tasks trained together only when the job has world_size tasks); a
    one-task job is a plain process. Where no group is joined, one in-process worker runs here."""
    assert launched_group() is None
    for k, v in srun_task(6).items():
        clean_env.setenv(k, v)
    assert launched_group().rank == 6 and launched_group(8).world_size == 8
    assert launched_group(4) is None
    ran = run_group(lambda rank, world, x: (rank, world, x), 1, ("a",), join_size=4, in_process=True)
    assert ran == (0, 1, "a")
    for k in LAUNCH_VARS:
        clean_env.delenv(k, raising=False)
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    assert launch_env() is not None and launched_group() is None and launched_group(1) is None


def test_a_job_exports_the_slurm_rendezvous_for_env_init(clean_env: pytest.MonkeyPatch) -> None:
    for k, v in srun_task(5, nodes="127.0.0.[1-2]", job_id="77").items():
        clean_env.setenv(k, v)
    ident = {"rank": 5, "world": 8, "local_rank": 1, "job_id": "77", "restart": 0, "hosts": ["x"]}
    e = export_torch_env(ident)
    assert {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")} == {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(PORT_BASE + 77),
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
    }
    assert e.source == "slurm"
    with pytest.raises(RuntimeError, match="SLURM's variables say rank 5 of 8, submitit's rank 4"):
        export_torch_env({**ident, "rank": 4})


# ----------------------------------------------------------------------------- whole nodes


def test_an_eight_worker_cell_asks_for_two_whole_nodes_of_four_gpus(tmp_path: Path) -> None:
    prof = load_profile(CONFIGS / "clusters" / "example.yaml")
    assert prof.gpus_per_node == 4
    grid = load_experiment(CONFIGS / "experiments" / "paper.yaml")
    cell = next(c for c in grid.cells if c.axes["world_size"] == 8)
    params = slurm_parameters(prof, 8, f"paper:{cell.id}")
    assert (params["nodes"], params["ntasks_per_node"], params["gpus_per_node"]) == (2, 4, 4)
    lines = sbatch_script(prof, 8, f"paper:{cell.id}", tmp_path).splitlines()
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4"} <= set(lines)
    # A 4-worker cell stays on one node.
    assert [slurm_parameters(prof, 4, "x")[k] for k in ("nodes", "ntasks_per_node")] == [1, 4]
