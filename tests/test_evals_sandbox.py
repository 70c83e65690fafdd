"""The code sandbox (evals/sandbox.py), the pass@k estimator and the local `code_eval` metric.

Hostile programs, each of which must be contained, scored as failed, and leave the host unharmed.

The sandbox holds differently as root and as a normal user (SLURM jobs are not root), so the
containment scenarios run in three modes, each in a driver process:

- `root`: as root (private uid, namespaces); only when the tests run as root (CI does).
- `user`: as an unprivileged user, with unprivileged user namespaces (most distributions).
- `user-plain`: as an unprivileged user without namespaces (sites that disable them).

Run as root, the tests drop to a uid of their own (never used by anything else, so the process
counts are deterministic) for the two user modes; run as a normal user, they run those modes as
that user and skip `root`. That user already runs `_SLEEPERS` other processes, so the per-user
process limit must leave the program its share, not block every fork.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from evals import sandbox
from evals.code_eval import compute_code_eval, estimate_pass_at_k
from evals.sandbox import Limits, run_program

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="uid/network/mount isolation as root needs root")
FAST = Limits(timeout_s=2.0, cpu_s=2)
REPO = Path(__file__).resolve().parent.parent


def test_a_correct_program_passes_and_a_wrong_one_fails():
    ok = run_program("def add(a, b):\n    return a + b\nassert add(2, 3) == 5\n", FAST)
    bad = run_program("def add(a, b):\n    return a * b\nassert add(2, 3) == 5\n", FAST)
    assert ok.passed and ok.returncode == 0
    assert not bad.passed and bad.status == "failed" and "AssertionError" in bad.stderr_tail


def test_the_program_may_write_in_its_own_directory():
    r = run_program("open('scratch.txt', 'w').write('hi')\nassert open('scratch.txt').read() == 'hi'", FAST)
    assert r.passed, r.stderr_tail


def test_allocating_50_gb_fails_with_memory_error():
    r = run_program("x = bytearray(50 * 2**30)\n", FAST)
    assert not r.passed and "MemoryError" in r.stderr_tail


@needs_root
def test_writing_and_deleting_outside_its_directory_fail(tmp_path):
    victim_dir = tmp_path / "shared"
    victim_dir.mkdir()
    os.chmod(victim_dir, 0o777)  # even a world-writable directory is read-only in the sandbox
    victim = victim_dir / "precious.txt"
    victim.write_text("keep me")
    os.chmod(victim, 0o666)
    for prog in (
        f"open({str(victim_dir / 'new.txt')!r}, 'w').write('x')",
        f"import os\nos.remove({str(victim)!r})",
        f"open({str(victim)!r}, 'w').write('overwritten')",
        f"open({str(REPO / 'evil.txt')!r}, 'w').write('x')",
        "import shutil\nshutil.rmtree('/tmp')",
    ):
        r = run_program(prog, FAST)
        assert not r.passed, prog
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in victim_dir.iterdir()) == ["precious.txt"]
    assert not (REPO / "evil.txt").exists()


@needs_root
def test_no_network_not_even_the_hosts_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        r = run_program(
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), "
            "timeout=1)\ns.sendall(b'leak')\n",
            FAST,
        )
        r2 = run_program("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n", FAST)
        # The kernel completes a handshake without accept(): a connection would be queued now.
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert not r.passed and not r2.passed


def test_environment_secrets_are_not_visible(monkeypatch):
    monkeypatch.setenv("CLUSTER_TEST_SECRET", "s3cr3t-value")
    r = run_program(
        "import os\nprint(sorted(os.environ))\n"
        "print(open('/proc/%d/environ' % os.getppid(), 'rb').read()[:0])\n"
        "assert 'CLUSTER_TEST_SECRET' in os.environ\n",
        FAST,
    )
    assert not r.passed
    assert "s3cr3t-value" not in r.stdout_tail + r.stderr_tail


@pytest.mark.parametrize(
    "trick",
    [
        "import os\nos._exit(0)\n",
        "import sys\nsys.exit(0)\n",
        "raise SystemExit\n",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    ],
)
def test_exiting_early_with_status_zero_does_not_count_as_passing(trick):
    r = run_program(trick + "assert False, 'the tests would fail'\n", FAST)
    assert not r.passed


def test_output_flood_is_cut_off_and_bounded():
    t0 = time.monotonic()
    r = run_program("while True:\n    print('x' * 10000)\n", FAST)
    assert not r.passed
    assert len(r.stdout_tail) <= FAST.output_tail_bytes
    assert time.monotonic() - t0 < FAST.timeout_s + 4


def test_the_output_files_cannot_be_swapped_for_a_link(tmp_path):
    # Were stdout read back by name, the caller (root, in CI) would read this file for the
    # program and put it into the result.
    secret = tmp_path / "secret.txt"
    secret.write_text("only-the-caller-may-read-this")
    os.chmod(secret, 0o600)
    r = run_program(
        "import os\nfor name in ('.stdout', '.stderr'):\n"
        "    if os.path.exists(name):\n        os.remove(name)\n"
        f"    os.symlink({str(secret)!r}, name)\n",
        FAST,
    )
    assert r.passed, r.stderr_tail
    assert "only-the-caller" not in r.stdout_tail + r.stderr_tail


# ------------------------------------------------------------------- containment, in each mode

_SLEEPERS = 40  # processes the unprivileged user already runs (not as root)
_NPROC = 8  # Limits.max_processes in the fork-bomb scenario
_SETTLE_S = 0.6  # after the daemon's run: longer than its escaped child waits before it writes

# Each scenario tags its processes with a marker (comm via PR_SET_NAME, or argv[0] of an exec),
# so the driver can look for survivors in /proc right after the run returns.
_TAG = "import ctypes\nctypes.CDLL(None).prctl(15, {marker!r}.encode(), 0, 0, 0)\n"
_HUMANEVAL_STYLE = """
def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])


def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False


check(has_close_elements)
"""
# A fork bomb that counts: forks until the kernel refuses; every child sleeps (tagged).
_FORK_COUNT = """
import os
n = 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print("forks", n, e.errno)
        break
    if pid == 0:
        os.execv("/bin/sleep", [{marker!r}, "30"])
    n += 1
"""
# The classic daemon: fork, setsid, fork again; the grandchild outlives its parents and, a
# moment after the program ended, writes a file (here it execs a tagged Python to do so).
_DAEMON = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import sys, time; time.sleep(0.3); "
                 "open(sys.argv[1], 'w').write('escaped')", {escape!r}, {marker!r}])
    os._exit(0)
os.waitpid(pid, 0)
time.sleep(0.1)  # the grandchild has exec'd and is now an orphan
print("daemon started")
"""
# The same daemon, then the program kills its parent: the supervisor without namespaces (the
# documented escape: same uid), the sandbox's init with them (which ignores it).
_KILL_PARENT = _DAEMON.replace(
    'print("daemon started")',
    """import signal
try:
    os.kill(os.getppid(), signal.SIGKILL)
except OSError as e:  # as root, the init is root's: the private uid may not even signal it
    print("refused", e.errno)
print("still here")""",
)
# A timeout with a tree: a daemon that sleeps, then an exponential fork bomb that never ends.
_TIMEOUT_TREE = (
    _TAG
    + """
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", [{marker!r}, "30"])
    os._exit(0)
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
)
# Where the program lives, what else it can write, and a directory it makes hard to delete.
_DIRS = """
import json, os, tempfile
for d in (os.environ["HOME"], os.environ["TMPDIR"]):
    open(os.path.join(d, "f.txt"), "w").write("x")
os.makedirs("home/locked/deep")
os.chmod("home/locked", 0)
outside = {{}}
for name, path in (("tmp", "/tmp/cluster-repro-test-" + {marker!r}),
                   ("marker_dir", {escape!r})):
    try:
        open(path, "w").write("x")
        os.remove(path)
        outside[name] = "written"
    except OSError as e:
        outside[name] = e.strerror
print(json.dumps({{"home": os.environ["HOME"], "tmpdir": os.environ["TMPDIR"], "cwd": os.getcwd(),
                  "gettempdir": tempfile.gettempdir(), "outside": outside,
                  "modes": [oct(os.stat(os.environ[k]).st_mode & 0o777)
                            for k in ("HOME", "TMPDIR")]}}))
"""
_NETWORK = """
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"leak")
    print("network: connected")
except OSError as e:
    print("network: refused", e.errno)
"""

# Runs as the mode's user: the scenarios one after another, a /proc scan for survivors right
# after each, and (at the end) a wait until an escaped daemon would have written its file.
_DRIVER = r"""
import json, os, socket, subprocess, sys, time
job = json.loads(open(sys.argv[1]).read())
sys.path.insert(0, job["sandbox_dir"])
import sandbox

def survivors(marker):
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                comm = open(f"/proc/{d}/comm", "rb").read()
                cmd = open(f"/proc/{d}/cmdline", "rb").read()
            except OSError:
                continue
            if marker.encode() in comm + cmd:
                found.append(int(d))
    return found

sleepers = [subprocess.Popen(["/bin/sleep", "60"]) for _ in range(job["sleepers"])]
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(8)
out = {"euid": os.geteuid(), "results": {}}
ended = time.monotonic()
for name, s in job["scenarios"].items():
    code = s["code"].replace("{port}", str(server.getsockname()[1]))
    r = sandbox.run_program(code, sandbox.Limits(**s["limits"]),
                            use_namespaces=job["use_namespaces"])
    out["results"][name] = {"status": r.status, "stdout": r.stdout_tail,
                            "stderr": r.stderr_tail[-500:], "isolation": r.isolation,
                            "seconds": r.seconds, "survivors": survivors(s["marker"])}
    if s["delayed_write"]:
        ended = time.monotonic()
server.setblocking(False)
try:
    server.accept()
    out["accepted"] = True
except BlockingIOError:
    out["accepted"] = False
time.sleep(max(0.0, ended + job["settle_s"] - time.monotonic()))
for p in sleepers:
    p.kill()
    p.wait()
print(json.dumps(out))
"""

_MODES = {"root": (0, True), "user": (_SLEEPERS, True), "user-plain": (_SLEEPERS, False)}


def _scenarios(escape_dir: Path) -> dict:
    quick = {"timeout_s": 5.0, "cpu_s": 5}
    out = {}
    for name, template, limits in (
        # First: the later runs count towards the settling time of their delayed writes.
        ("daemon", _DAEMON, quick),
        ("kill_parent", _KILL_PARENT, quick),
        ("humaneval_style", _HUMANEVAL_STYLE, quick),
        ("fork_count", _FORK_COUNT, dict(quick, max_processes=_NPROC)),
        ("timeout_tree", _TIMEOUT_TREE, {"timeout_s": 1.0, "cpu_s": 5}),
        ("dirs", _DIRS, quick),
        ("network", _NETWORK, quick),
        ("memory", "bytearray(50 * 2**30)\n", quick),
    ):
        marker = f"crx{name[:4]}{secrets.token_hex(3)}"  # fits comm's 15 characters
        escape = str(escape_dir / f"{name}-escaped.txt")
        code = (
            template
            if "{marker" not in template
            else template.format(marker=marker, escape=escape, port="{port}")
        )
        out[name] = {
            "code": code,
            "limits": limits,
            "marker": marker,
            "escape": escape,
            "delayed_write": name in ("daemon", "kill_parent"),
        }
    return out


@pytest.fixture(scope="module")
def _all_modes():
    """Start one driver per mode, all at once (they are independent), and collect them:
    {mode: (exit status, stdout, stderr, files that escaped into its escape directory)}."""
    work = Path(tempfile.mkdtemp(prefix="cluster-repro-sandbox-test-"))
    test_uids = []
    try:
        # The unprivileged user must read the sandbox and write (for the escape attempts) here.
        os.chmod(work, 0o755)
        shutil.copy(REPO / "evals" / "sandbox.py", work / "sandbox.py")
        started = {}
        for name, (sleepers, use_namespaces) in _MODES.items():
            if name == "root" and not ROOT:
                continue
            escape_dir = work / f"escape-{name}"
            escape_dir.mkdir()
            os.chmod(escape_dir, 0o777)
            job = {
                "sandbox_dir": str(work),
                "scenarios": _scenarios(escape_dir),
                "sleepers": sleepers,
                "use_namespaces": use_namespaces,
                "settle_s": _SETTLE_S,
            }
            as_user = {}
            if ROOT and name != "root":
                # A uid per mode, apart from the sandbox's private ones (sandbox._UID_RANGE).
                uid = 2_100_000_000 + secrets.randbelow(40_000_000)
                as_user = {"user": uid, "group": uid, "extra_groups": []}
                test_uids.append(uid)
            job_file = work / f"job-{name}.json"
            job_file.write_text(json.dumps(job))
            os.chmod(job_file, 0o644)
            proc = subprocess.Popen(
                [sandbox._interpreter(), "-I", "-c", _DRIVER, str(job_file)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=work,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                **as_user,
            )
            started[name] = (proc, escape_dir)
        done = {}
        for name, (proc, escape_dir) in started.items():
            stdout, stderr = proc.communicate(timeout=120)
            done[name] = (proc.returncode, stdout, stderr, sorted(p.name for p in escape_dir.iterdir()))
        yield done
    finally:
        for uid in test_uids:  # should a regression leave (say) a fork bomb running
            sandbox._kill_uid(uid)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(params=list(_MODES))
def mode(request, _all_modes):
    """(mode name, the driver's results, files that escaped) for each mode."""
    name = request.param
    if name not in _all_modes:
        pytest.skip("the root mode needs root")
    returncode, stdout, stderr, escaped = _all_modes[name]
    assert returncode == 0, stderr
    out = json.loads(stdout)
    assert (out["euid"] == 0) == (name == "root")
    isolation = out["results"]["humaneval_style"]["isolation"]
    if name == "user" and "user-namespace" not in isolation:
        pytest.skip(f"unprivileged user namespaces are not available here: {isolation}")
    return name, out, escaped


def test_each_mode_reports_the_isolation_it_had(mode):
    name, out, _ = mode
    iso = out["results"]["humaneval_style"]["isolation"]
    assert {"subreaper", "rlimits", "no-new-privs", "private-home-tmpdir"} <= set(iso)
    namespaced = {"pid-namespace", "no-network", "read-only-fs"}
    if name == "root":
        assert namespaced | {"private-uid", "nproc-exact"} <= set(iso)
    elif name == "user":
        assert namespaced | {"user-namespace"} <= set(iso) and "private-uid" not in iso
    else:
        assert not namespaced & set(iso) and "nproc-above-user-count" in iso


def test_normal_code_still_passes(mode):
    r = mode[1]["results"]["humaneval_style"]
    assert r["status"] == "passed", r
    assert r["survivors"] == []


def test_a_fork_bomb_is_capped_but_not_blocked_by_the_users_other_processes(mode):
    r = mode[1]["results"]["fork_count"]
    assert r["status"] == "passed", r
    forks = int(r["stdout"].split("forks")[1].split()[0])
    # max_processes counts the program's own process; the user runs _SLEEPERS more already.
    if "nproc-exact" in r["isolation"]:
        assert forks == _NPROC - 1, r["stdout"]
    else:  # the user's other processes share the headroom: they may start or stop meanwhile
        assert _NPROC // 2 <= forks <= _NPROC - 1, r["stdout"]
    assert r["survivors"] == []  # the sleeping children were killed with the program


def test_a_setsid_double_forked_daemon_is_dead_and_never_writes(mode):
    r = mode[1]["results"]["daemon"]
    assert r["status"] == "passed" and "daemon started" in r["stdout"], r
    assert r["survivors"] == []
    assert "daemon-escaped.txt" not in mode[2]  # checked _SETTLE_S after the run: it never came


def test_the_program_cannot_kill_its_supervisor_except_without_namespaces(mode):
    name, out, escaped = mode
    r = out["results"]["kill_parent"]
    if name == "user-plain":  # documented: the same uid may kill the supervisor, then escape
        assert r["status"] == "error" and "supervisor" in r["stderr"], r
    else:  # its parent is the sandbox's init, which a namespace's processes cannot kill
        assert r["status"] == "passed" and "still here" in r["stdout"], r
        assert r["survivors"] == [] and "kill_parent-escaped.txt" not in escaped


def test_a_timeout_kills_the_whole_tree(mode):
    r = mode[1]["results"]["timeout_tree"]
    assert r["status"] == "timeout", r
    assert r["seconds"] < 1.0 + 4
    assert r["survivors"] == []  # neither the daemon nor any process of the bomb


def test_home_and_tmpdir_are_private_and_removed_afterwards(mode):
    name, out, _ = mode
    r = out["results"]["dirs"]
    assert r["status"] == "passed", r
    seen = json.loads(r["stdout"].split("\n")[0])
    home, tmpdir, cwd = Path(seen["home"]), Path(seen["tmpdir"]), Path(seen["cwd"])
    assert home.parent == tmpdir.parent == cwd and Path(seen["gettempdir"]) == tmpdir
    assert cwd.parent.name.startswith("cluster-repro-sandbox-")
    assert seen["modes"] == ["0o700", "0o700"]
    # Gone afterwards, also the directory the program made unreadable.
    assert not cwd.parent.exists()
    # Outside its directory: nothing with namespaces; where the user may write, without.
    expected = "written" if name == "user-plain" else "Read-only file system"
    assert seen["outside"] == {"tmp": expected, "marker_dir": expected}


def test_network_only_without_namespaces(mode):
    name, out, _ = mode
    stdout = out["results"]["network"]["stdout"]
    if name == "user-plain":  # documented: without namespaces the program has the network
        assert "network: connected" in stdout and out["accepted"]
    else:
        assert "network: refused" in stdout and not out["accepted"]


def test_memory_is_limited(mode):
    r = mode[1]["results"]["memory"]
    assert r["status"] == "failed" and "MemoryError" in r["stderr"]


# ----------------------------------------------------------------------------- pass@k


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that a random k-subset of n samples (c correct) holds a correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(
    "n,c,k", [(5, 2, 1), (5, 2, 2), (6, 0, 3), (6, 6, 1), (7, 3, 4), (10, 1, 5), (4, 3, 2)]
)
def test_unbiased_pass_at_k_matches_counting_subsets(n, c, k):
    assert math.isclose(estimate_pass_at_k(n, c, k), _brute_pass_at_k(n, c, k), abs_tol=1e-12)


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError, match="k <= n"):
        estimate_pass_at_k(3, 1, 4)


def test_code_eval_has_the_hub_metrics_signature_and_output():
    refs = ["assert add(2, 3) == 5", "assert neg(1) == -1"]
    preds = [
        ["def add(a, b): return a * b", "def add(a, b): return a + b"],
        ["def neg(x): return -x", "import os\nos._exit(0)"],
    ]
    scores, results = compute_code_eval(
        references=refs, predictions=preds, k=[1, 2, 5], num_workers=2, timeout=3.0
    )
    assert scores == {"pass@1": 0.5, "pass@2": 1.0}  # pass@5 left out: only 2 candidates each
    assert [r[1]["passed"] for r in results[0]] == [False, True]
    assert [r[1]["passed"] for r in results[1]] == [True, False]
    assert results[1][1][0] == 1 and results[1][1][1]["task_id"] == 1


def test_evaluate_loads_the_metric_from_a_local_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    import evaluate

    metric = evaluate.load(str(REPO / "evals" / "metrics" / "code_eval"))
    scores, results = metric.compute(
        references=["assert f() == 1"],
        predictions=[["def f(): return 1", "def f(): return 2", "def f():\n    while True: pass"]],
        k=[1, 3],
        timeout=2.0,
    )
    assert math.isclose(scores["pass@1"], 1 / 3) and scores["pass@3"] == 1.0
    assert [r[1]["passed"] for r in results[0]] == [True, False, False]
    assert results[0][2][1]["result"] == "timed out"
