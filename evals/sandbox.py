"""Run untrusted Python (model-generated code plus its tests) in a contained child process.

Two processes stand between the caller and the program:

- the **supervisor**: this file run as a script by a fresh interpreter (`python -I -S -B
  sandbox.py`, standard library only), so that no thread or lock of the caller is inherited.
  It marks itself a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`), so every orphan of the
  program's tree (a `setsid()` + double-fork daemon included) is re-parented to it; it enforces
  the wall-clock limit and, when the program ends or times out, stops and kills every descendant
  until it has no child left.
- where namespaces are available: the sandbox's **init** (pid 1 of a new pid namespace), which
  starts the program and exits with it; the kernel then kills every process left in that
  namespace, and nothing in it can signal a process outside.

Where the program runs depends on who runs us (`ExecResult.isolation` lists what was in force):

- **root** (containers, CI): new pid, network, IPC and mount namespaces (every mount read-only
  except the run directory; no network, not even the host's 127.0.0.1) and a random unprivileged
  uid never used by anything else. If the namespaces cannot be created, nothing runs (an error).
- **a normal user with unprivileged user namespaces** (most Linux distributions, SLURM jobs
  included): the same namespaces inside a new user namespace that maps the user's own uid. The
  program keeps the user's uid, so it can *read* what the user can read, but it cannot write
  outside its run directory, reach the network, or signal any process outside the sandbox.
- **a normal user without them** (disabled by the site, or `use_namespaces=False`): the
  subreaper, the rlimits and a private run directory only. The program can write wherever the
  user can (including /tmp), use the network, and signal the user's other processes, so a
  program that deliberately kills its supervisor first can escape; docs/benchmarks.md has the
  table.

In every mode the program gets rlimits (CPU seconds, address space, file size: stdout/stderr go
to unnamed files, so a flood is cut off, never buffered in our memory; open files; no core
dumps; tasks, see `Limits.max_processes`), `no_new_privs` (no setuid binaries), a scrubbed
environment, and its own run directory (cwd, HOME and TMPDIR), removed afterwards.

A program passes only if it exits with status 0 *and* the harness wrapper printed a random nonce
after the program finished: `os._exit(0)` or `sys.exit(0)` before the tests ran is a failure.
The nonce lives only in memory (passed through pipes, never a file, argv or the environment);
code that deliberately introspects the wrapper's interpreter frames could find it, which no model
output does by accident.
"""

from __future__ import annotations

import ctypes
import json
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Linux constants (sched.h, sys/mount.h, sys/prctl.h).
_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38

_UID_RANGE = (1_000_000, 2_000_000_000)  # far from real accounts and from nobody (65534)
_SUPERVISOR_GRACE_S = 15.0  # the caller's backstop: supervisor start-up and the final kill
_KILL_DEADLINE_S = 10.0  # how long the supervisor may take to kill a tree before it gives up

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

    timeout_s: float = 10.0  # wall clock, enforced by the supervisor
    cpu_s: int = 10  # CPU seconds (RLIMIT_CPU), per process
    memory_bytes: int = 1 << 30  # address space (RLIMIT_AS), per process
    # Tasks (processes *and* threads) the program may have at once, its own process included.
    # Exact with a private uid (root) or a user namespace on Linux >= 5.14, where the kernel
    # counts the sandbox's tasks apart. Otherwise RLIMIT_NPROC counts every task of the user, so
    # the limit is set to (the user's task count at start) + this: see docs/benchmarks.md.
    max_processes: int = 32
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


# ============================================================================ the caller's side


def run_program(code: str, limits: Limits | None = None, *, use_namespaces: bool = True) -> ExecResult:
    """Run `code` (a complete Python program, e.g. a completion followed by its tests) contained.

    `use_namespaces=False` runs without namespaces even where they are available (the fallback
    a site without unprivileged user namespaces gets; for tests). Returns an ExecResult; never
    raises for anything the program does.
    """
    limits = limits or Limits()
    uid = None
    if os.geteuid() == 0:
        uid = secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0]
    base = Path(tempfile.mkdtemp(prefix="cluster-repro-sandbox-"))  # 0700
    try:
        workdir = _prepare_run_dir(base, code, uid)
        nonce = secrets.token_hex(16)
        # Unnamed files: the program cannot swap them for a link to something we would then read.
        with tempfile.TemporaryFile(dir=base) as out, tempfile.TemporaryFile(dir=base) as err:
            config = {
                "workdir": str(workdir),
                "uid": uid,
                "nonce": nonce,
                "interpreter": _interpreter(),
                "wrapper": _WRAPPER,
                "use_namespaces": use_namespaces,
                "limits": asdict(limits),
                "stdout_fd": out.fileno(),
                "stderr_fd": err.fileno(),
            }
            report, problem = _run_supervisor(config, limits, (out.fileno(), err.fileno()))
            stdout = _tail(out, limits.output_tail_bytes + 64)
            stderr = _tail(err, limits.output_tail_bytes)
        isolation = list(report.get("isolation", [])) if report else []
        if problem or report.get("error"):
            return ExecResult("error", None, 0.0, "", f"sandbox: {problem or report['error']}", isolation)
        rc = report["returncode"]
        if report["timed_out"] or rc == -signal.SIGXCPU:
            # SIGXCPU: the CPU limit; on an idle machine a busy loop reaches it with the wall clock.
            status = "timeout"
        elif rc == 0 and nonce in stdout:
            status = "passed"
        else:
            status = "failed"
        stdout = stdout.replace(nonce, "<nonce>")[-limits.output_tail_bytes :]
        return ExecResult(status, rc, report["seconds"], stdout, stderr, isolation)
    finally:
        _remove_tree(base)


def _prepare_run_dir(base: Path, code: str, uid: int | None) -> Path:
    """base/w holds program.py, home/ (HOME) and tmp/ (TMPDIR); the program's cwd. Owned by the
    private uid when there is one; base stays ours (0700, or 0711: traversable, not listable)."""
    workdir = base / "w"
    paths = [workdir, workdir / "home", workdir / "tmp"]
    for p in paths:
        p.mkdir(mode=0o700)
    (workdir / "program.py").write_text(code, encoding="utf-8")
    if uid is not None:
        for p in paths + [workdir / "program.py"]:
            os.chown(p, uid, uid)
        os.chmod(base, 0o711)
    return workdir


def _run_supervisor(
    config: dict, limits: Limits, pass_fds: tuple[int, ...]
) -> tuple[dict | None, str | None]:
    """Start the supervisor (this file, in a fresh interpreter) and return (report, problem)."""
    cmd = [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__)]
    try:
        sup = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
    except OSError as e:
        return None, f"could not start the supervisor: {e}"
    try:
        out, err = sup.communicate(
            json.dumps(config).encode() + b"\n", timeout=limits.timeout_s + _SUPERVISOR_GRACE_S
        )
    except subprocess.TimeoutExpired:
        # Its init (if any) dies with it (PDEATHSIG), and with init the whole pid namespace.
        sup.kill()
        sup.communicate()
        return None, "the supervisor did not finish in time and was killed"
    try:
        return json.loads(out.decode().strip().splitlines()[-1]), None
    except (ValueError, IndexError):
        tail = err.decode(errors="replace").strip()[-500:]
        return None, f"the supervisor failed (exit status {sup.returncode}): {tail}"


def _interpreter() -> str:
    """A Python the sandboxed program may execute. $CLUSTER_REPRO_SANDBOX_PYTHON wins; else ours
    if (as root) every directory on its path is world-searchable; else the system python3."""
    env = os.environ.get("CLUSTER_REPRO_SANDBOX_PYTHON")
    if env:
        return env
    if os.geteuid() != 0:
        return sys.executable
    real = Path(os.path.realpath(sys.executable))
    if all(p.stat().st_mode & stat.S_IXOTH for p in real.parents) and real.stat().st_mode & stat.S_IXOTH:
        return sys.executable
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(cand):
            return cand
    return sys.executable


def _tail(fh, n: int) -> str:
    """The last n bytes of an open file, decoded."""
    fh.seek(0, os.SEEK_END)
    fh.seek(max(0, fh.tell() - n))
    return fh.read().decode("utf-8", errors="replace")


def _remove_tree(path: Path) -> None:
    """Delete the run directory, also where the program took its own permissions away."""
    try:
        shutil.rmtree(path)
        return
    except OSError:
        pass
    _open_dir(str(path))
    for root, dirs, _ in os.walk(path):  # top-down: a directory is opened before it is walked
        for d in dirs:
            _open_dir(os.path.join(root, d))
    shutil.rmtree(path, ignore_errors=True)


def _open_dir(path: str) -> None:
    """chmod 0700 a directory of the run dir, never through a link (it may point anywhere)."""
    if not os.path.islink(path):
        try:
            os.chmod(path, 0o700)
        except OSError:
            pass


# ============================================================================ the supervisor
# Everything below runs in the supervisor's own interpreter (standard library only).


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)  # the interpreter's own libc
    return _LIBC


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int) -> None:
    _check(
        _libc().prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
        f"prctl({option})",
    )


def _mount(source: bytes | None, target: bytes, fstype: bytes | None, flags: int) -> int:
    return _libc().mount(source, target, fstype, ctypes.c_ulong(flags), None)


def _supervisor_main() -> None:
    """Read the config (one JSON line on stdin), run the program, print the report (one line)."""
    config = json.loads(sys.stdin.readline())
    # SIGCHLD stays blocked: we wait for it with sigtimedwait (children restore their mask).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        report = _supervise(config)
    except Exception as e:  # a harness failure: the caller reports status "error"
        report = {"error": f"{type(e).__name__}: {e}"}
        _kill_descendants()
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


def _supervise(config: dict) -> dict:
    """Contain the program as well as this user can, run it, kill whatever it left behind."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    uid = config["uid"]
    namespaces, nproc, isolation = _contain(config)
    if namespaces is None:
        return {"error": isolation.pop(), "isolation": isolation}
    _prctl(_PR_SET_DUMPABLE, 0)  # the user's other processes cannot ptrace or read us
    start = time.monotonic()
    deadline = start + config["limits"]["timeout_s"]
    try:
        if namespaces:
            status, extra = _run_in_pid_namespace(config, nproc, deadline)
            isolation += extra
        else:
            status = _run_directly(config, nproc, deadline)
    finally:
        _kill_descendants()
        if uid is not None:
            _kill_uid(uid)  # belt and braces: nothing of the private uid may remain
    seconds = time.monotonic() - start
    if isinstance(status, str):  # the program could not be started
        return {"error": status, "isolation": isolation}
    return {
        "returncode": None if status is None else os.waitstatus_to_exitcode(status),
        "timed_out": status is None,
        "seconds": seconds,
        "isolation": isolation,
    }


def _contain(config: dict) -> tuple[bool | None, int, list[str]]:
    """Enter the namespaces this user may have; decide the task limit.

    Returns (namespaces entered, RLIMIT_NPROC for the program, isolation notes); namespaces is
    None, with the reason as the last note, when we run as root and the namespaces fail (root
    must get them all: nothing runs half-contained).
    """
    uid, workdir = config["uid"], os.path.realpath(config["workdir"])
    isolation = ["subreaper", "rlimits", "no-new-privs", "scrubbed-env", "private-home-tmpdir"]
    if uid is not None:
        isolation.append("private-uid")
    flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWPID
    if os.geteuid() != 0:
        flags |= _CLONE_NEWUSER
    namespaces = bool(config["use_namespaces"])
    if namespaces:
        refused = _probe_namespaces(flags, workdir)
        if refused and os.geteuid() == 0:
            return (
                None,
                0,
                isolation
                + [f"running as root, but the namespaces could not be set up ({refused}); nothing was run"],
            )
        if refused:
            namespaces = False
            isolation.append(f"no-namespaces ({refused})")
    # Counted before entering a user namespace, where other users' processes all show as one uid.
    exact = uid is not None or (namespaces and _kernel_counts_tasks_per_namespace())
    isolation.append("nproc-exact" if exact else "nproc-above-user-count")
    nproc = _nproc_limit(config["limits"]["max_processes"], uid, namespaces, exact)
    if namespaces:
        _enter_namespaces(flags)
        writable = _remount_read_only(workdir)
        isolation += (["user-namespace"] if flags & _CLONE_NEWUSER else []) + [
            "pid-namespace",
            "no-network",
            "ipc-namespace",
            "read-only-fs" if not writable else f"read-only-fs (still writable: {writable})",
        ]
    return namespaces, nproc, isolation


# ------------------------------------------------------------------------------ namespaces


def _probe_namespaces(flags: int, workdir: str) -> str | None:
    """Try the namespace setup in a throw-away child: None if it works, else why not.

    The supervisor cannot leave a user namespace once in it, so a site that allows the
    namespace but not the mounts (e.g. an LSM policy) would otherwise leave it half-contained.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _enter_namespaces(flags)
            _remount_read_only(workdir)
            os._exit(0)
        except BaseException as e:  # noqa: BLE001 - anything here means "not available"
            os.write(w, str(e).encode()[:500])
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        reason = fh.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else (reason or "refused")


def _enter_namespaces(flags: int) -> None:
    """unshare(flags); in a new user namespace, map our uid and gid to themselves.

    The same uid inside keeps file ownership in the run directory right; since it is not 0
    inside, exec drops every capability the namespace gave us, so the program has none.
    """
    uid, gid = os.getuid(), os.getgid()
    _check(_libc().unshare(flags), "unshare")
    if flags & _CLONE_NEWUSER:
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            try:
                os.write(fd, text.encode())  # one write: the kernel wants the map in one go
            finally:
                os.close(fd)


def _mount_points() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of this process's mount namespace, from mountinfo."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            mp = parts[4].encode().decode("unicode_escape")  # \040 for spaces etc.
            out.append((mp, set(parts[5].split(","))))
    return out


def _remount_read_only(workdir: str) -> list[str]:
    """In our new mount namespace: the run directory stays writable, every other mount becomes
    read-only. Returns the mount points that stayed writable; raises if / did."""
    mounts = _mount_points()
    # Our mounts must not propagate back to the host namespace.
    _check(_mount(None, b"/", None, _MS_REC | _MS_PRIVATE), "making / a private mount")
    wd = workdir.encode()
    _check(_mount(wd, wd, None, _MS_BIND | _MS_REC), "bind-mounting the run directory")
    failed = []
    for mp, opts in mounts:
        if mp == workdir or "ro" in opts:
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        # Keep the flags the mount has: a user namespace may not clear them (EPERM otherwise).
        flags |= _MS_NOSUID if "nosuid" in opts else 0
        flags |= _MS_NODEV if "nodev" in opts else 0
        flags |= _MS_NOEXEC if "noexec" in opts else 0
        if _mount(None, mp.encode(), None, flags) != 0:
            if mp == "/":
                _check(-1, "remounting / read-only")
            failed.append(mp)
    return failed


def _run_in_pid_namespace(config: dict, nproc: int, deadline: float) -> tuple[int | str | None, list[str]]:
    """Fork the sandbox's init (pid 1 of the new pid namespace), which runs the program.

    Returns (wait status of the program, None on timeout, or a start-up error message; extra
    isolation notes). Killing init, which the timeout does, makes the kernel kill everything
    in the namespace.
    """
    r, w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(r)
        _init_main(config, nproc, w)  # never returns
    os.close(w)
    if _wait_for(init, deadline) is None:
        os.kill(init, signal.SIGKILL)
        _wait_for(init, None)
        os.close(r)
        return None, []
    with os.fdopen(r, "rb") as fh:
        msg = json.loads(fh.read().decode() or '{"error": "the sandbox init died"}')
    if "error" in msg:
        return msg["error"], msg.get("isolation", [])
    return msg["status"], msg["isolation"]


def _init_main(config: dict, nproc: int, report_fd: int) -> None:
    """pid 1 of the sandbox: start the program, reap orphans until it exits, report, exit (and
    so kill what is left: the kernel does that when a pid namespace's init exits)."""
    msg: dict = {"isolation": []}
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the supervisor killed: init and all go too
        # A mount namespace of our own, so the fresh /proc below is not the supervisor's.
        _check(_libc().unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        if _mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC) == 0:
            msg["isolation"].append("private-proc")  # the program sees only its own processes
        prog = _start_program(config, nproc)
        if isinstance(prog, str):
            msg["error"] = prog
        else:
            msg["status"] = _wait_for(prog, None)
    except BaseException as e:  # noqa: BLE001 - reported to the supervisor, never raised
        msg["error"] = f"sandbox init: {type(e).__name__}: {e}"
    os.write(report_fd, json.dumps(msg).encode())
    os._exit(0)


def _kernel_counts_tasks_per_namespace() -> bool:
    """Linux >= 5.14 counts RLIMIT_NPROC per user namespace (ucounts), so a new namespace starts
    at zero; older kernels count every task of the uid, wherever it runs."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


# ------------------------------------------------------------------------------ the program


def _nproc_limit(max_processes: int, uid: int | None, namespaces: bool, exact: bool) -> int:
    """The RLIMIT_NPROC that leaves the program `max_processes` tasks, its own included.

    RLIMIT_NPROC is checked at fork against the count of the *user's* tasks (processes and
    threads), not the program's. Private uid: nothing else runs as it, the count starts at 0.
    User namespace on a new kernel: the count is per namespace, and the supervisor and the init
    are in it. Otherwise: every task of the user counts, so we add the count now (the program
    then shares the headroom with whatever else the user starts or stops meanwhile). Never above
    the user's own hard limit, which a normal user cannot raise.
    """
    if uid is not None:
        return max_processes
    if exact:
        return max_processes + 2  # + the supervisor and the init
    current = _tasks_of_uid(os.getuid()) + (1 if namespaces else 0)  # + the init, not yet born
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    limit = current + max_processes
    return limit if hard == resource.RLIM_INFINITY else min(limit, hard)


def _tasks_of_uid(uid: int) -> int:
    """Tasks (threads) whose real uid is `uid`, as RLIMIT_NPROC counts them (visible ones)."""
    total = 0
    for _, fields in _proc_status_fields(("Uid", "Threads")):
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            total += int(fields.get("Threads", "1"))
    return total


def _run_directly(config: dict, nproc: int, deadline: float) -> int | str | None:
    """No namespaces: the program is our child; orphans come to us (subreaper)."""
    prog = _start_program(config, nproc)
    if isinstance(prog, str):
        return prog
    return _wait_for(prog, deadline)


def _start_program(config: dict, nproc: int) -> int | str:
    """Fork and exec the wrapper under the limits. Returns its pid, or why it could not start
    (the child reports a failed step through a close-on-exec pipe, as subprocess does)."""
    r_nonce, w_nonce = os.pipe()
    os.write(w_nonce, (config["nonce"] + "\n").encode())
    os.close(w_nonce)
    r_err, w_err = os.pipe()  # both close-on-exec: closed by a successful exec
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r_err)
            _become_program(config, nproc, r_nonce)
        except BaseException as e:  # noqa: BLE001
            os.write(w_err, f"{type(e).__name__}: {e}".encode()[:500])
        os._exit(127)
    os.close(w_err)
    os.close(r_nonce)
    with os.fdopen(r_err, "rb") as fh:
        failure = fh.read().decode(errors="replace")
    if failure:
        os.waitpid(pid, 0)
        return f"the program could not be started: {failure}"
    return pid


def _become_program(config: dict, nproc: int, stdin_fd: int) -> None:
    """In the forked child: limits, identity, descriptors, then exec the wrapper."""
    lim = config["limits"]
    os.setsid()  # its own session and process group, away from any terminal
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    for src, dst in ((stdin_fd, 0), (config["stdout_fd"], 1), (config["stderr_fd"], 2)):
        os.dup2(src, dst)
    for fd in {stdin_fd, config["stdout_fd"], config["stderr_fd"]} - {0, 1, 2}:
        os.close(fd)
    os.chdir(config["workdir"])
    for what, value in (
        (resource.RLIMIT_CPU, lim["cpu_s"]),
        (resource.RLIMIT_AS, lim["memory_bytes"]),
        (resource.RLIMIT_FSIZE, lim["max_file_bytes"]),
        (resource.RLIMIT_NOFILE, lim["max_open_files"]),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, nproc),
    ):
        # CPU: SIGXCPU at the soft limit (reported as a timeout), SIGKILL one second later.
        _lower_limit(what, value, value + 1 if what == resource.RLIMIT_CPU else value)
    if config["uid"] is not None:
        uid = config["uid"]
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.umask(0o077)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)  # setuid binaries cannot give the program privileges
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    workdir = config["workdir"]
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": os.path.join(workdir, "home"),
        "TMPDIR": os.path.join(workdir, "tmp"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    interp = config["interpreter"]
    os.execve(interp, [interp, "-I", "-B", "-c", config["wrapper"]], env)


def _lower_limit(what: int, soft: int, hard: int) -> None:
    """setrlimit, never above the current hard limit (which only root may raise)."""
    cur_hard = resource.getrlimit(what)[1]
    if cur_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, cur_hard), min(hard, cur_hard)
    resource.setrlimit(what, (soft, hard))


# ------------------------------------------------------------------------------ reaping, killing


def _wait_for(pid: int, deadline: float | None) -> int | None:
    """Reap our children (orphans included) until `pid` exits: its wait status, or None once
    `deadline` (time.monotonic()) has passed. Needs SIGCHLD blocked."""
    while True:
        while True:
            try:
                got, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                raise RuntimeError(f"process {pid} is not our child") from None
            if got == 0:
                break
            if got == pid:
                return status
        if deadline is None:
            signal.sigwaitinfo({signal.SIGCHLD})
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        signal.sigtimedwait({signal.SIGCHLD}, remaining)


def _stop_then_kill(pids: list[int]) -> None:
    """SIGSTOP every pid first (so none can fork while the others die), then SIGKILL them all."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _kill_descendants() -> None:
    """Stop and kill every descendant until we have no child left.

    As a subreaper we inherit every orphan of the tree, so "no child" means "no descendant".
    Stopping first keeps a fork bomb from growing while we kill it; top-down order means a
    process's parent is stopped before we signal it, so its pid cannot be reaped and reused.
    """
    end = time.monotonic() + _KILL_DEADLINE_S
    me = os.getpid()
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"descendants survived {_KILL_DEADLINE_S:.0f} s of SIGKILL")
        tree = _descendants(me)
        _stop_then_kill(tree)
        try:
            signal.sigtimedwait({signal.SIGCHLD}, 0.05)
        except InterruptedError:
            pass


def _descendants(root: int) -> list[int]:
    """Pids below `root` in the process tree, parents before children (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                text = fh.read()
        except OSError:
            continue
        try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            ppid = int(text[text.rindex(b")") + 2 :].split()[1])
        except (ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def _proc_status_fields(names: tuple[str, ...]):
    """(pid, {name: value}) for every process, from /proc/PID/status."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        fields = {}
        try:
            with open(f"/proc/{d}/status", encoding="utf-8") as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    if key in names:
                        fields[key] = value.strip()
        except OSError:
            continue
        yield int(d), fields


def _kill_uid(uid: int) -> None:
    """Kill every process of the private uid until none is left (stopped first: no forking)."""
    end = time.monotonic() + _KILL_DEADLINE_S
    while True:
        pids = [pid for pid, f in _proc_status_fields(("Uid",)) if f.get("Uid", "").split()[:1] == [str(uid)]]
        if not pids:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"processes of uid {uid} survived {_KILL_DEADLINE_S:.0f} s")
        _stop_then_kill(pids)
        time.sleep(0.02)


if __name__ == "__main__":
    _supervisor_main()
