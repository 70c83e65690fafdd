"""A real hub-compatible server for the hub tests (tests/test_hub_*.py): olah (PyPI 0.5.4, MIT),
which serves local git repositories through the Hugging Face hub's HTTP API, on 127.0.0.1.

olah needs other versions of some packages than the suite pins, so it lives in a virtual
environment of its own (`make install` puts it in .venv/hub-server; CLUSTER_REPRO_HUB_SERVER_VENV
names another) and is talked to over HTTP only.

`hub_server` (session) builds the mirror repositories (tests/hub_mirrors.py) once per test run and
starts one server on a free loopback port. Under `make test` the xdist workers share both: the
first builds and starts under a file lock, each worker leaves a mark of its pid, and the last one
out stops exactly the process group it started. `hub_env` is what points one `cluster-repro`
process at the server: HF_ENDPOINT, the three offline flags at 0 (for that process only; the test
process itself stays offline), a private hub cache, and a dead proxy for every host but
127.0.0.1, so nothing reaches beyond the loopback. Without olah installed the tests FAIL, saying
how to install it; they never skip.

The same server as a local mirror (docs/hub.md):

    .venv/bin/python -m tests.hub_helpers serve --mirrors DIR [--port 8791] [--test-repos]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: python tests/hub_helpers.py serve ...
    sys.path.insert(0, str(REPO))

import pytest  # noqa: E402

from repro.core.io import atomic_write_json, file_lock, read_json  # noqa: E402

HUB_SERVER_VENV = Path(os.environ.get("CLUSTER_REPRO_HUB_SERVER_VENV") or REPO / ".venv" / "hub-server")
START_TIMEOUT_S = 180  # olah imports FastAPI and GitPython: seconds on a loaded 2-core machine
# A proxy that refuses every connection: a request to any host but the loopback fails at once.
DEAD_PROXY = "http://127.0.0.1:9"


_STARTED: dict[int, subprocess.Popen] = {}  # the servers this process started, by pid


@dataclass
class HubServer:
    endpoint: str  # what HF_ENDPOINT is set to: http://127.0.0.1:<port>
    pid: int  # the server's process, leader of its own process group
    config: str  # its config file (the process's command line names it)
    mirrors: str  # the folder of mirror repositories: models/<org>/<name>, datasets/<org>/<name>


def olah_cli() -> Path:
    exe = HUB_SERVER_VENV / "bin" / "olah-cli"
    if not exe.is_file():
        raise FileNotFoundError(
            f"{exe} not found: the hub tests' server (olah) is not installed. Run `make install` "
            "(it creates .venv/hub-server from tests/hub-server-requirements.txt), or set "
            "CLUSTER_REPRO_HUB_SERVER_VENV to a virtual environment that has olah"
        )
    return exe


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def no_proxy_env() -> dict[str, str]:
    """Proxy variables under which only 127.0.0.1 and localhost are reached (both spellings)."""
    out = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        out[name] = out[name.lower()] = DEAD_PROXY
    out["NO_PROXY"] = out["no_proxy"] = "127.0.0.1,localhost"
    return out


def _answers(endpoint: str) -> bool:
    """Whether an HTTP server answers at `endpoint` (any status; a refused connection: no)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        opener.open(f"{endpoint}/api/models/none/none/revision/main", timeout=5).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def _is_ours(server: HubServer) -> bool:
    """The pid is still the server that was started (its command line names its config)."""
    try:
        return server.config.encode() in Path(f"/proc/{server.pid}/cmdline").read_bytes()
    except OSError:
        return False


def start_server(mirrors: Path, workdir: Path, port: int | None = None) -> HubServer:
    """Start olah in offline mode on 127.0.0.1, serving the git repositories under `mirrors`
    (branch main; every commit is a revision); its config, cache and log go in `workdir`.
    Returns once it answers HTTP; RuntimeError (with its log) if it does not."""
    exe = olah_cli()
    workdir.mkdir(parents=True, exist_ok=True)
    last = ""
    for _ in range(3):  # a free port taken by another process before olah binds it: another one
        use = port or free_port()
        config = workdir / f"olah-{use}.toml"
        config.write_text(
            "[basic]\n"
            'host = "127.0.0.1"\n'
            f"port = {use}\n"
            f'repos-path = "{workdir / "cache"}"\n'
            f'mirrors-path = ["{mirrors}"]\n'
            # metadata is read from the git repositories at each request: a push shows at once
            "metadata-cache-ttl = 0\n"
            "[accessibility]\n"
            "offline = true\n"
        )
        endpoint = f"http://127.0.0.1:{use}"
        log = workdir / "server.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(exe), "-c", str(config), "--log-path", str(workdir / "logs")],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **no_proxy_env()},
                start_new_session=True,  # its own process group: stopped with its git children
            )
        server = HubServer(endpoint, proc.pid, str(config), str(mirrors))
        _STARTED[proc.pid] = proc
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(endpoint):
                return server
            time.sleep(0.5)
        stop_server(server)
        last = log.read_text(errors="replace")[-3000:]
        if port is not None:
            break
    raise RuntimeError(f"the hub server (olah) did not start; its log ({workdir / 'server.log'}):\n{last}")


def stop_server(server: HubServer, timeout: float = 20.0) -> None:
    """Stop the server's process group (SIGTERM, then SIGKILL): only while its pid is still the
    server that was started."""
    if not _is_ours(server):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(server.pid):
            time.sleep(0.2)
        if server.pid in _STARTED:  # started by this process: reap it (no zombie left)
            _STARTED.pop(server.pid).poll()
        if not _alive(server.pid):
            return


def hub_env(server: HubServer, hf_home: Path) -> dict[str, str]:
    """The variables that point a `cluster-repro` process at `server`, with its own hub cache
    `hf_home`; to be merged into os.environ for a subprocess."""
    return {
        "HF_ENDPOINT": server.endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        # the cache folders themselves too: a user's HF_HUB_CACHE would win over HF_HOME
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
        "HF_DATASETS_CACHE": str(hf_home / "datasets"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",  # a user's token is not sent to the test server
        "CLUSTER_REPRO_NO_PROGRESS": "1",
        "PYTHONPATH": str(REPO),
        **no_proxy_env(),
    }


# ----------------------------------------------------------------------------- the fixture


def _data_dir() -> Path:
    env = os.environ.get("CLUSTER_REPRO_DATA")
    d = Path(env) if env else REPO.parent / "shared" / "data"
    if not d.is_dir():
        raise FileNotFoundError(
            f"shared data not found at {d}: set CLUSTER_REPRO_DATA to the shared/data folder"
        )
    return d


def build_test_mirrors(root: Path, data_dir: Path) -> Path:
    """The hub tests' mirror repositories under `root`/mirrors (built once: a folder without its
    `.complete` mark is an interrupted build and is built again)."""
    from repro.core.config.schema import LoraConfig, ModelConfig
    from repro.core.models import materialize_model
    from tests.hub_mirrors import build_mirrors

    mirrors = root / "mirrors"
    if (mirrors / ".complete").is_file():
        return mirrors
    shutil.rmtree(mirrors, ignore_errors=True)
    tiny = ModelConfig(name_or_path="tiny-random-llama", lora=LoraConfig(enabled=False))
    model_dir = materialize_model(tiny, seed=0, workdir=root / "model-build")
    build_mirrors(mirrors, data_dir, model_dir)
    (mirrors / ".complete").touch()
    return mirrors


def _run_root(tmp_path_factory) -> Path:
    """A folder shared by the test processes of this test run only (xdist's workers have a base
    folder each, under one per run)."""
    base = Path(tmp_path_factory.getbasetemp())
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """The hub server of this test run (started by the first test process that asks)."""
    root = _run_root(tmp_path_factory) / "hub"
    root.mkdir(exist_ok=True)
    lock, state, users = root / ".lock", root / "server.json", root / "users"
    try:
        with file_lock(lock):
            server = HubServer(**read_json(state)) if state.is_file() else None
            if server is None or not (_is_ours(server) and _answers(server.endpoint)):
                mirrors = build_test_mirrors(root, _data_dir())
                server = start_server(mirrors, root / "server")
                atomic_write_json(state, asdict(server))
            users.mkdir(exist_ok=True)
            (users / str(os.getpid())).touch()
    except (FileNotFoundError, RuntimeError) as e:
        pytest.fail(str(e))
    yield server
    with file_lock(lock):
        (users / str(os.getpid())).unlink(missing_ok=True)
        if not any(p.name.isdigit() and _alive(int(p.name)) for p in users.iterdir()):
            stop_server(server)
            state.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- a local mirror


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.hub_helpers",
        description="Serve the git repositories under --mirrors (models/<org>/<name>, "
        "datasets/<org>/<name>, branch main) through the Hugging Face hub's HTTP API on "
        "127.0.0.1, as the hub tests do, until Ctrl-C.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="start the server in the foreground")
    s.add_argument("--mirrors", required=True, help="the folder of mirror repositories")
    s.add_argument("--port", type=int, default=None, help="default: a free port")
    s.add_argument("--workdir", default=None, help="its config, cache and log (default: MIRRORS/.server)")
    s.add_argument(
        "--test-repos",
        action="store_true",
        help="first build the hub tests' repositories into MIRRORS (from $CLUSTER_REPRO_DATA)",
    )
    args = p.parse_args(argv)
    mirrors = Path(args.mirrors).expanduser().resolve()
    workdir = Path(args.workdir).expanduser().resolve() if args.workdir else mirrors / ".server"
    if args.test_repos:
        root = mirrors.parent / f".{mirrors.name}.build"
        built = build_test_mirrors(root, _data_dir())
        shutil.copytree(built, mirrors, dirs_exist_ok=True)
    server = start_server(mirrors, workdir, args.port)
    # SIGTERM (kill, a job's end) stops the server too, as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(
        f"serving {mirrors} at {server.endpoint} (pid {server.pid}; log {workdir / 'server.log'})\n"
        f"export HF_ENDPOINT={server.endpoint} HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 "
        "TRANSFORMERS_OFFLINE=0",
        flush=True,
    )
    try:
        while _alive(server.pid):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
