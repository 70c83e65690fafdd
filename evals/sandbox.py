"""Run untrusted Python (model-generated code plus its tests) in a contained child process.

Every program runs in a fresh process started with `start_new_session` (its own process group),
in a fresh temporary directory, with:

- a wall-clock limit (the parent kills it) and a CPU-time limit (RLIMIT_CPU);
- a memory limit (RLIMIT_AS: address space, so a 50 GB allocation fails with MemoryError);
- RLIMIT_NPROC (fork bombs), RLIMIT_FSIZE (disk and output floods: stdout/stderr go to files in
  the sandbox directory, so a flood is cut off by the size limit, never buffered in our memory),
  RLIMIT_NOFILE and no core dumps;
- a scrubbed environment (PATH, LANG, HOME only: no secrets inherited);
- when we run as root (containers, CI): a new network namespace (only a loopback that is down: no
  network, not even the host's 127.0.0.1), a new mount namespace in which every mount is remounted
  read-only except the sandbox directory, and an unprivileged user id never used by anything else,
  so the program cannot write, delete or signal anything of ours and RLIMIT_NPROC applies;
- at the end, the whole process group is killed, and every process of that user id (a child that
  escaped the group with setsid()) is killed too.

A program passes only if it exits with status 0 *and* the harness wrapper printed a random nonce
after the program finished: `os._exit(0)` or `sys.exit(0)` before the tests ran is a failure.
The nonce lives only in the wrapper's memory (read from a pipe, never in a file or the
environment); code that deliberately introspects the wrapper's interpreter frames could find it,
which no model output does by accident. Without root the namespaces and the user switch are not
available: the rlimits, the scrubbed environment and the process-group kill still apply, and
`ExecResult.isolation` says which protections were in force.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Linux constants (sched.h, sys/mount.h).
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18

_UID_RANGE = (1_000_000, 2_000_000_000)  # far from real accounts and from nobody (65534)

# The wrapper that runs the program: reads the nonce from stdin, runs program.py as __main__,
# prints the nonce only if the program returned normally.
_WRAPPER = r"""
import sys
_n = sys.stdin.readline().strip()
sys.stdin.close()
with open("program.py", encoding="utf-8") as _f:
    _src = _f.read()
_g = {"__name__": "__main__", "__builtins__": __builtins__}
exec(compile(_src, "program.py", "exec"), _g)
sys.stdout.flush()
sys.stdout.write("\n" + _n + "\n")
sys.stdout.flush()
"""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one program. Seconds, bytes, counts."""

    timeout_s: float = 10.0  # wall clock, enforced by the parent
    cpu_s: int = 10  # CPU seconds (RLIMIT_CPU), per process
    memory_bytes: int = 1 << 30  # address space (RLIMIT_AS)
    max_processes: int = 32  # RLIMIT_NPROC (effective only under a private user id)
    max_file_bytes: int = 8 << 20  # RLIMIT_FSIZE: largest file, including stdout/stderr
    max_open_files: int = 64  # RLIMIT_NOFILE
    output_tail_bytes: int = 2048  # how much of stdout/stderr the result keeps


@dataclass
class ExecResult:
    """What happened to one program. `status`: passed, failed, timeout, or error (harness)."""

    status: str
    returncode: int | None
    seconds: float
    stdout_tail: str = ""
    stderr_tail: str = ""
    isolation: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _interpreter() -> str:
    """A Python the sandbox user may execute. $CLUSTER_REPRO_SANDBOX_PYTHON wins; else ours if
    every directory on its path is world-searchable; else the system python3 (stdlib only)."""
    env = os.environ.get("CLUSTER_REPRO_SANDBOX_PYTHON")
    if env:
        return env
    if os.geteuid() != 0:
        return sys.executable
    real = Path(os.path.realpath(sys.executable))
    if all(p.stat().st_mode & stat.S_IXOTH for p in real.parents) and \
            real.stat().st_mode & stat.S_IXOTH:
        return sys.executable
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(cand):
            return cand
    return sys.executable


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _LIBC


def _mount_points() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of this process's mount namespace, from mountinfo."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            mp = parts[4].encode().decode("unicode_escape")  # \040 for spaces etc.
            out.append((mp, set(parts[5].split(","))))
    return out


def _make_preexec(workdir: str, uid: int | None, limits: Limits):
    """The function the child runs between fork and exec (as root when uid is set).

    Everything it needs is computed here, before the fork: the child runs no imports and reads
    no files, so a lock another thread held at fork time (code_eval runs programs from a thread
    pool) cannot deadlock it. The mount list is the parent's, which the new namespace copies.
    """
    libc = _libc() if uid is not None else None
    wd = workdir.encode()
    remounts = []
    if uid is not None:
        for mp, opts in _mount_points():
            if mp == workdir:
                continue
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
            flags |= _MS_NOSUID if "nosuid" in opts else 0
            flags |= _MS_NODEV if "nodev" in opts else 0
            flags |= _MS_NOEXEC if "noexec" in opts else 0
            remounts.append((mp.encode(), flags, mp == "/"))

    def preexec() -> None:
        if uid is not None:
            if libc.unshare(_CLONE_NEWNET | _CLONE_NEWNS) != 0:
                raise OSError("unshare(CLONE_NEWNET | CLONE_NEWNS) failed")
            # Our mounts must not propagate back to the host namespace.
            if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
                raise OSError("making / a private mount failed")
            # The sandbox dir becomes its own (writable) mount; everything else read-only.
            if libc.mount(wd, wd, None, _MS_BIND | _MS_REC, None) != 0:
                raise OSError("bind-mounting the sandbox directory failed")
            for mp, flags, required in remounts:
                if libc.mount(None, mp, None, flags, None) != 0 and required:
                    raise OSError("remounting / read-only failed")
        os.chdir(workdir)
        lim = [
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_AS, limits.memory_bytes),
            (resource.RLIMIT_FSIZE, limits.max_file_bytes),
            (resource.RLIMIT_NOFILE, limits.max_open_files),
            (resource.RLIMIT_CORE, 0),
        ]
        if uid is not None:
            lim.append((resource.RLIMIT_NPROC, limits.max_processes))
        for what, value in lim:
            # CPU: SIGXCPU at the soft limit (reported as a timeout, like the wall clock: on an
            # idle machine a busy loop reaches both at once), SIGKILL one second later.
            hard = value + 1 if what == resource.RLIMIT_CPU else value
            resource.setrlimit(what, (value, hard))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.umask(0o077)

    return preexec


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(d))
                        break
        except (OSError, ValueError):
            continue
    return pids


def _kill_all(proc: subprocess.Popen, uid: int | None) -> None:
    """Kill the process group, then (private uid) every process of that uid until none is left."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    if uid is None:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = _pids_of_uid(uid)
        if not pids:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # freeze first, so nobody forks meanwhile
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        time.sleep(0.02)
    raise RuntimeError(f"sandbox: processes of uid {uid} survived 10 s of SIGKILL")


def _tail(path: Path, n: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def run_program(code: str, limits: Limits | None = None) -> ExecResult:
    """Run `code` (a complete Python program, e.g. a completion followed by its tests) contained.

    Returns an ExecResult; never raises for anything the program does.
    """
    limits = limits or Limits()
    as_root = os.geteuid() == 0
    uid = secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0] if as_root else None
    isolation = ["process-group", "rlimits", "scrubbed-env", "own-tmpdir"]
    if as_root:
        isolation += ["private-uid", "no-network", "read-only-fs"]
    base = Path(tempfile.mkdtemp(prefix="cluster-repro-sandbox-"))
    workdir = base / "w"  # base stays root-only (0700); the program sees only workdir
    workdir.mkdir()
    try:
        (workdir / "program.py").write_text(code, encoding="utf-8")
        if uid is not None:
            for p in (workdir, workdir / "program.py"):
                os.chown(p, uid, uid)
            os.chmod(base, 0o711)  # the private uid may traverse base, not list it
        nonce = secrets.token_hex(16)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir),
               "PYTHONDONTWRITEBYTECODE": "1"}
        out_path, err_path = workdir / ".stdout", workdir / ".stderr"
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            if uid is not None:
                os.fchown(out.fileno(), uid, uid)
                os.fchown(err.fileno(), uid, uid)
            try:
                proc = subprocess.Popen(
                    [_interpreter(), "-I", "-B", "-c", _WRAPPER], stdin=subprocess.PIPE,
                    stdout=out, stderr=err, env=env, cwd="/", start_new_session=True,
                    close_fds=True,
                    preexec_fn=_make_preexec(str(workdir), uid, limits))
            except (OSError, subprocess.SubprocessError) as e:
                # Includes a failed isolation step in the child (preexec): never run unconfined.
                return ExecResult("error", None, 0.0, "", f"sandbox start failed: {e}", isolation)
            timed_out = False
            try:
                try:
                    proc.stdin.write((nonce + "\n").encode())
                    proc.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_all(proc, uid)
        seconds = time.monotonic() - start
        rc = proc.returncode
        stdout = _tail(out_path, limits.output_tail_bytes + 64)
        stderr = _tail(err_path, limits.output_tail_bytes)
        if timed_out or rc == -signal.SIGXCPU:
            status = "timeout"
        elif rc == 0 and nonce in stdout:
            status = "passed"
        else:
            status = "failed"
        stdout = stdout.replace(nonce, "<nonce>")[-limits.output_tail_bytes:]
        return ExecResult(status, rc, seconds, stdout, stderr, isolation)
    finally:
        shutil.rmtree(base, ignore_errors=True)
