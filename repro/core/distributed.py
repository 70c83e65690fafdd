"""Starting a torch.distributed process group: spawned locally, or from SLURM/torchrun variables.

Locally, `spawn_workers` starts `world_size` processes with `torch.multiprocessing` on 127.0.0.1
and a port the launcher's own store listens on, forked from a fork server that imported torch,
transformers, peft and the worker modules once (`preload_in_workers`), so a launch does not pay
W fresh imports (see "Starting workers" below); a group whose ranks could not connect (a rare
gloo flake) is started again, before any work. Under SLURM or torchrun the
processes already exist and `launch_env` reads where each one stands (`init_from_env` joins):

    torchrun (wins when RANK and WORLD_SIZE are set): RANK, WORLD_SIZE, LOCAL_RANK,
        MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500)
    SLURM (a task started by `srun`, i.e. SLURM_STEP_ID is set):
        rank        SLURM_PROCID
        world size  SLURM_NTASKS
        local rank  SLURM_LOCALID (picks the CUDA device: `cuda_device_index`)
        master      the first host of the step's node list (SLURM_STEP_NODELIST, else
                    SLURM_JOB_NODELIST, else SLURM_NODELIST), SLURM's compressed form
                    `gpu[01-02,07],cpu-a3` expanded by `expand_hostlist`; MASTER_ADDR wins if set
        port        `master_port_for_job(SLURM_JOB_ID)`; MASTER_PORT wins if set

Every task computes the same master and port from variables SLURM gives all of them, so they
agree without talking. SLURM places ranks 0..n-1 on the first node of the list (block and cyclic
distribution alike), so the master is rank 0's node, where torch's TCP store listens.

A batch script itself (`sbatch`, outside `srun`) also sees SLURM_PROCID=0 and SLURM_NTASKS=W of
the allocation, but it is one process, not W: without SLURM_STEP_ID it is not treated as a rank.
Backend: gloo on CPU, nccl on GPU.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.constants import default_pg_timeout

from repro.core.errors import UserValueError

_log = logging.getLogger(__name__)

# Ports derived from job ids: below Linux's ephemeral range (32768-60999), so no outgoing
# connection of the node holds one by chance; consecutive job ids get different ports.
PORT_BASE, PORT_SPAN = 10000, 20000


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


# ----------------------------------------------------------------------------- SLURM node lists

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _expand_group(body: str, where: str) -> list[str]:
    """The numbers of one bracket group: "01-03,7" -> ["01", "02", "03", "7"].

    Zero padding follows the lower bound's width, as SLURM writes it ("08-10": 08, 09, 10).
    """
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part)
        if not m:
            raise UserValueError(
                f"node list {where!r}: '[{body}]' has {part!r}, expected a number or a range like 01-04"
            )
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise UserValueError(f"node list {where!r}: the range {part!r} runs backwards")
        width = len(lo) if lo.startswith("0") else 0
        out += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    return out


def _expand_host(expr: str, where: str) -> list[str]:
    """One host expression: text with any number of bracket groups ("rack[1-2]-gpu[01-02]"),
    expanded as their product, the leftmost group varying slowest."""
    names = [""]
    i = 0
    while i < len(expr):
        if expr[i] == "[":
            j = expr.find("]", i)
            if j < 0 or "[" in expr[i + 1 : j]:
                raise UserValueError(f"node list {where!r}: '[' without its ']' in {expr!r}")
            names = [n + x for n in names for x in _expand_group(expr[i + 1 : j], where)]
            i = j + 1
        elif expr[i] == "]":
            raise UserValueError(f"node list {where!r}: ']' without its '[' in {expr!r}")
        else:
            ends = [k for k in (expr.find("[", i), expr.find("]", i)) if k >= 0]
            j = min(ends, default=len(expr))
            names = [n + expr[i:j] for n in names]
            i = j
    return names


def expand_hostlist(nodelist: str) -> list[str]:
    """SLURM's compressed host list -> host names, in order.

    `gpu[01-02,07],cpu-a3` -> [gpu01, gpu02, gpu07, cpu-a3]; `127.0.0.[1-2]` -> [127.0.0.1,
    127.0.0.2]. Commas inside brackets separate numbers, outside them hosts. Raises ValueError
    naming the list for anything else (an empty list or name, an unclosed bracket, a bad range).
    """
    hosts: list[str] = []
    depth, start = 0, 0
    text = nodelist.strip()
    for i, c in enumerate(text + ","):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            expr = text[start:i].strip()
            if not expr:
                raise UserValueError(f"node list {nodelist!r}: an empty host name")
            hosts += _expand_host(expr, nodelist)
            start = i + 1
    if depth != 0:
        raise UserValueError(f"node list {nodelist!r}: unbalanced brackets")
    return hosts


def master_port_for_job(job_id: str | int) -> int:
    """The rendezvous port of a job, from its id alone (so every task agrees without talking).

    A numeric id (SLURM_JOB_ID; an array task has its own) maps to PORT_BASE + id % PORT_SPAN, so
    jobs sharing a node collide only when their ids differ by a multiple of PORT_SPAN; any other
    id (submitit's "123_4") through its CRC32.
    """
    text = str(job_id).strip()
    n = int(text) if text.isdigit() else zlib.crc32(text.encode())
    return PORT_BASE + n % PORT_SPAN


# ----------------------------------------------------------------------------- a worker's place


@dataclass(frozen=True)
class LaunchEnv:
    """One worker's place in a process group launched from outside (torchrun or SLURM's srun)."""

    rank: int
    world_size: int
    local_rank: int  # rank among the workers of this node: picks the CUDA device
    master_addr: str
    master_port: int
    source: str  # "torchrun", "slurm" (or "submitit": slurm/jobs.py outside SLURM)

    def torch_vars(self) -> dict[str, str]:
        """The variables of torch's env:// initialization (and of torchrun) for this worker."""
        return {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
        }


def _int_var(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None:
        if default is None:
            raise UserValueError(f"environment variable {name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise UserValueError(f"environment variable {name}={raw!r} is not a whole number") from None


def _checked(e: LaunchEnv, names: str) -> LaunchEnv:
    if e.world_size < 1 or not 0 <= e.rank < e.world_size or e.local_rank < 0:
        raise UserValueError(
            f"{names}: rank {e.rank}, world size {e.world_size}, local rank "
            f"{e.local_rank}; expected 0 <= rank < world size and local rank >= 0"
        )
    if not 0 < e.master_port < 65536:
        raise UserValueError(f"{names}: port {e.master_port} is not a TCP port (1-65535)")
    return e


def torchrun_env(environ: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """From torchrun's variables (RANK, WORLD_SIZE, ...); None when RANK or WORLD_SIZE is unset."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    rank = _int_var(env, "RANK")
    return _checked(
        LaunchEnv(
            rank,
            _int_var(env, "WORLD_SIZE"),
            _int_var(env, "LOCAL_RANK", rank),
            env.get("MASTER_ADDR") or "127.0.0.1",
            _int_var(env, "MASTER_PORT", 29500),
            "torchrun",
        ),
        "torchrun variables RANK/WORLD_SIZE/LOCAL_RANK/MASTER_PORT",
    )


def slurm_env(environ: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """From SLURM's variables in a task started by srun; None outside one (see the module doc)."""
    env = os.environ if environ is None else environ
    if not all(k in env for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID")):
        return None
    addr = env.get("MASTER_ADDR")
    if not addr:
        key = next(
            (k for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(k)), None
        )
        if key is None:
            raise UserValueError(
                "SLURM task without a node list (SLURM_STEP_NODELIST, "
                "SLURM_JOB_NODELIST, SLURM_NODELIST): no master address"
            )
        try:
            addr = expand_hostlist(env[key])[0]
        except ValueError as e:
            raise UserValueError(f"{key}: {e}") from None
    if env.get("MASTER_PORT"):
        port = _int_var(env, "MASTER_PORT")
    elif env.get("SLURM_JOB_ID"):
        port = master_port_for_job(env["SLURM_JOB_ID"])
    else:
        raise UserValueError("SLURM task without SLURM_JOB_ID (or MASTER_PORT): no rendezvous port")
    return _checked(
        LaunchEnv(
            _int_var(env, "SLURM_PROCID"),
            _int_var(env, "SLURM_NTASKS"),
            _int_var(env, "SLURM_LOCALID", 0),
            addr,
            port,
            "slurm",
        ),
        "SLURM variables SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/MASTER_PORT",
    )


def launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """This process's place in an externally launched group: torchrun's variables win, then
    SLURM's; None for a plain process (which spawns its own workers)."""
    return torchrun_env(environ) or slurm_env(environ)


def env_rank_world() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) from torchrun or SLURM variables, or None if not set."""
    e = launch_env()
    return None if e is None else (e.rank, e.world_size, e.local_rank)


def launched_group(world_size: int | None = None) -> LaunchEnv | None:
    """This process's place in a group of more than one process launched by torchrun or srun, of
    exactly `world_size` processes when given (a job whose tasks train together); None for a plain
    process, a one-task job or a job of another size, each of which starts its own workers."""
    e = launch_env()
    if e is None or e.world_size < 2 or (world_size is not None and e.world_size != world_size):
        return None
    return e


def cuda_device_index(local_rank: int, n_visible: int) -> int:
    """The CUDA device of a node's `local_rank`-th worker among `n_visible` devices.

    One device visible (SLURM bound one GPU to each task): that one. Otherwise the local rank's,
    which must exist: two workers on one GPU fail later in NCCL ("Duplicate GPU detected").
    """
    if n_visible < 1:
        raise UserValueError("no CUDA device visible")
    if n_visible == 1:
        return 0
    if local_rank >= n_visible:
        raise UserValueError(
            f"local rank {local_rank} needs a CUDA device of its own, but only "
            f"{n_visible} are visible (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): start at most "
            f"{n_visible} workers per node"
        )
    return local_rank


def local_rank(rank: int) -> int:
    """Worker `rank`'s index among the workers of its node: from torchrun/SLURM when this process
    was launched as that worker, else `rank` (workers spawned here share one node)."""
    e = launch_env()
    # Launched so, and this is that worker (not one that a launched process spawned itself).
    ours = (
        e is not None
        and e.rank == rank
        and (not dist.is_initialized() or dist.get_world_size() == e.world_size)
    )
    return e.local_rank if ours and e is not None else rank


def worker_device(rank: int) -> torch.device:
    """The device of worker `rank`: CPU without CUDA; else the CUDA device of its local rank."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", cuda_device_index(local_rank(rank), torch.cuda.device_count()))


def init_process_group(
    rank: int, world_size: int, master_addr: str, master_port: int, backend: str | None = None
) -> None:
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    dist.init_process_group(backend or default_backend(), rank=rank, world_size=world_size)


def init_from_env(backend: str | None = None) -> LaunchEnv:
    """Join the group this process was launched into (torchrun or srun); returns where it stands.

    Raises RuntimeError in a plain process (nothing to join: use `spawn_workers`).
    """
    e = launch_env()
    if e is None:
        raise RuntimeError(
            "not launched by torchrun or srun (no RANK/WORLD_SIZE, no SLURM task "
            "variables): there is no process group to join"
        )
    init_process_group(e.rank, e.world_size, e.master_addr, e.master_port, backend)
    return e


def set_worker_threads(world_size: int, threads: int | None = None) -> int:
    """Split the machine's cores between workers (oversubscription makes CPU DDP crawl)."""
    n = threads or max(1, (os.cpu_count() or 1) // world_size)
    torch.set_num_threads(n)
    return n


_SPAWNED_HERE = False  # set in the workers `spawn_workers` starts


def spawned_here() -> bool:
    """Whether this process is a worker that `spawn_workers` started, i.e. one of several
    processes of this machine that share its cores (`set_worker_threads`)."""
    return _SPAWNED_HERE


# ----------------------------------------------------------------------------- starting workers
# A fresh process imports torch, transformers and peft in seconds of CPU each; W workers per
# launch and three launches per run (features, training, eval) made those imports most of a CPU
# run's time (docs/measurements.md, "Starting workers"). So workers are forked from a fork
# server (multiprocessing's "forkserver" start method): one process, started at the first launch,
# that imports the preloaded modules once and forks a worker per request. It is a clean process
# (started fresh, not forked from this one), so no thread, CUDA context or lock of this process
# reaches the workers, as with "spawn".
#
# The server keeps the environment it started with, and modules read some variables at import
# (huggingface_hub's HF_HUB_OFFLINE, glibc's MALLOC_ settings at process start). So the server
# is restarted whenever this process's environment (apart from _LAUNCH_VARS) or the preload list
# has changed since it started, and each worker also gets this process's environment as it is
# at the launch. CLUSTER_REPRO_START_METHOD=spawn starts every worker fresh instead.

PRELOAD = ["torch", "transformers", "peft"]  # imported once by the fork server
START_METHOD_VAR = "CLUSTER_REPRO_START_METHOD"
_LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "PYTEST_CURRENT_TEST")  # per launch, not per server
_server_started_with: tuple[Any, ...] | None = None


def preload_in_workers(*modules: str) -> None:
    """Have the fork server import `modules` (the modules of worker functions call this with
    their own name), so that a worker starts with them already imported."""
    for m in modules:
        if m not in PRELOAD:
            PRELOAD.append(m)


def start_method() -> str:
    """forkserver (default, where the platform has it) or spawn (CLUSTER_REPRO_START_METHOD)."""
    method = os.environ.get(START_METHOD_VAR, "forkserver")
    if method not in ("forkserver", "spawn"):
        raise UserValueError(f"{START_METHOD_VAR}={method!r}: expected forkserver or spawn")
    if method == "forkserver" and "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    return method


def _ready_fork_server() -> bool:
    """Make the next forkserver launch use a server with this environment and PRELOAD; False
    where a running server cannot be restarted (then spawn)."""
    global _server_started_with
    import multiprocessing.forkserver as fs

    state = (
        tuple(sorted((k, v) for k, v in os.environ.items() if k not in _LAUNCH_VARS)),
        tuple(PRELOAD),
    )
    if state == _server_started_with:
        return True
    if _server_started_with is not None:
        stop = getattr(fs._forkserver, "_stop", None)  # the standard library's own restart hook
        if stop is None:
            return False
        stop()
    mp.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
    _server_started_with = state
    return True


def _nothing() -> None:
    pass


def warm_up_fork_server() -> None:
    """Have the fork server that workers come from up, its preloaded modules imported: a process
    pays this once, at its first launch. A stage that times its own work (the select stage's
    seconds, which compute matching reads) calls this first, so its seconds do not depend on
    whether it is the first launch of its process (`track run` and `grid` run many runs in one).
    A no-op child forked from the server waits for it to be ready. Nothing where the ranks were
    launched (torchrun, srun): those fork no workers."""
    if dist.is_initialized() or launched_group(None) is not None:
        return  # the ranks exist already (torchrun, srun): no worker is forked here
    if start_method() != "forkserver" or not _ready_fork_server():
        return
    child = mp.get_context("forkserver").Process(target=_nothing)
    child.start()
    child.join()


class GroupStartError(RuntimeError):
    """The local group did not form: gloo could not connect its ranks to each other. Raised
    before the worker function runs, so `spawn_workers` may start the group again."""


# How often `spawn_workers` starts a group whose ranks failed to connect (GroupStartError).
GROUP_START_ATTEMPTS = 3


def _init_group(store: dist.TCPStore, rank: int, world_size: int) -> None:
    """init_process_group on the launcher's store; a failure to connect the ranks' full mesh
    (gloo's "connectFullMesh failed ... Connection closed by peer", a rare flake of gloo's TCP
    transport on one machine, seen in PyTorch's own tests and in this suite's CI:
    docs/measurements.md) becomes GroupStartError."""
    try:
        dist.init_process_group(default_backend(), store=store, rank=rank, world_size=world_size)
    except RuntimeError as e:
        if "connectFullMesh" in str(e):
            raise GroupStartError(f"rank {rank} of {world_size}: the group did not form: {e}") from e
        raise


def _entry(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    port: int,
    args: tuple,
    environ: dict[str, str] | None = None,
) -> None:
    global _SPAWNED_HERE
    _SPAWNED_HERE = True
    if environ is not None:  # the launcher's environment at this launch (a forked worker's is the server's)
        os.environ.clear()
        os.environ.update(environ)
    # The launcher serves the group's store on `port` (spawn_workers): every rank, rank 0 too,
    # joins it as a client.
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=default_pg_timeout)
    _init_group(store, rank, world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # Done, and every file the worker writes is written (atomically) by now. Leave without the
    # interpreter's teardown: gloo's C++ threads can outlive destroy_process_group, and a worker
    # whose work had finished then died at exit with "terminate called without an active
    # exception" (SIGABRT), failing the whole run (seen once in CI, in a 2-process training).
    # A worker that raised does not get here: spawn reports its exception.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_workers(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    master_port: int | None = None,
    method: str | None = None,
) -> None:
    """Run fn(rank, world_size, *args) in `world_size` new processes joined in one group.

    `fn` must live in an importable module (not __main__): the workers import it by name.
    `method`: forkserver or spawn (None: `start_method()`); spawn where each worker must be a
    process of its own from the start (peak-memory benches). A worker's exception is re-raised
    here with its traceback (torch's ProcessRaisedException), except that a group whose ranks
    could not connect is started again (GroupStartError, below).
    """
    method = method or start_method()
    if method == "forkserver" and not _ready_fork_server():
        method = "spawn"
    # The group's store is served from this process, on a port bound here and held until the
    # workers end. A port found free (free_port) and bound later by rank 0 could be taken in
    # between by another process's socket on this machine, and the workers would meet a
    # stranger's store. Port 0: the system picks one.
    #
    # A group whose ranks could not connect (GroupStartError: no worker function has run yet) is
    # started again, with a new store, up to GROUP_START_ATTEMPTS times in all, as torchrun
    # restarts a failed group; any other failure of a worker is raised at once.
    for attempt in range(1, GROUP_START_ATTEMPTS + 1):
        try:
            port = master_port or 0
            store = dist.TCPStore("127.0.0.1", port, world_size, is_master=True, wait_for_workers=False)
        except RuntimeError as e:
            raise UserValueError(
                f"master port {master_port}: cannot listen on it ({str(e).splitlines()[0]}); set "
                "launch.master_port to a free port, or leave it unset for one the system picks"
            ) from e
        try:
            mp.start_processes(
                _entry,
                args=(fn, world_size, store.port, args, dict(os.environ)),
                nprocs=world_size,
                join=True,
                start_method=method,
            )
            return
        except mp.ProcessRaisedException as e:
            if GroupStartError.__name__ not in str(e) or attempt == GROUP_START_ATTEMPTS:
                raise
            mark = f"{GroupStartError.__name__}: "
            why = next((ln.split(mark, 1)[1] for ln in str(e).splitlines() if mark in ln), "")
            _log.warning(
                "%d workers: the group did not form (attempt %d of %d: %s); starting it again",
                world_size,
                attempt,
                GROUP_START_ATTEMPTS,
                why.strip()[:300],
            )
        finally:
            del store


def check_gpus_for(workers: int, key: str, default: str = "") -> None:
    """ValueError naming `key` when `workers` processes would need more GPUs than are visible
    (NCCL allows one process per GPU); nothing on CPU. `default` says what unset `key` means."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < workers:
        unset = f", or leave it unset for {default}" if default else ""
        raise UserValueError(
            f"{key}: {workers} processes but {gpus} visible CUDA GPU(s); NCCL needs "
            f"a GPU per process (set it to at most {gpus}{unset})"
        )


def run_group(
    fn: Callable[..., Any],
    workers: int,
    args: tuple = (),
    *,
    join_size: int | None,
    in_process: bool = False,
    key: str = "world_size",
    default: str = "",
    master_port: int | None = None,
    port_offset: int = 0,
    backend: str | None = None,
) -> Any:
    """Run fn(rank, world_size, *args) on every process of a group: join the group this process
    is part of, or start `workers` processes here. The one place that makes this choice, for the
    trainer, the feature pass and the eval stage:

    1. Join, when this process is in a group of more than one process, of `join_size` processes
       (None: of any size): one already initialized (fn runs in it as is), or one torchrun/srun
       launched (`launched_group`: joined on its master at master port + `port_offset`, with
       `backend`, and left afterwards). Every process of that group must call this. fn runs with
       the group's rank and size, which may differ from `workers`. Returns fn's result.
    2. Otherwise, with `in_process` and one worker, fn(0, 1, *args) in this process without a
       group; returns fn's result.
    3. Otherwise `workers` processes spawned here (`spawn_workers`, on `master_port` when given),
       after checking there is a GPU for each on a GPU machine (ValueError naming `key`, and what
       leaving it unset means, `default`). Returns None: the workers' results stay with them.
    """
    if dist.is_initialized() and dist.get_world_size() > 1 and join_size in (None, dist.get_world_size()):
        return fn(dist.get_rank(), dist.get_world_size(), *args)
    e = launched_group(join_size)
    if e is not None:
        init_process_group(e.rank, e.world_size, e.master_addr, e.master_port + port_offset, backend)
        try:
            return fn(e.rank, e.world_size, *args)
        finally:
            dist.destroy_process_group()
    if in_process and workers == 1:
        return fn(0, 1, *args)
    check_gpus_for(workers, key, default)
    spawn_workers(fn, workers, args=args, master_port=master_port)
    return None
