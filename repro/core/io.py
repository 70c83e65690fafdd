"""Atomic file writes (temp file in the same folder, fsync, rename) and small JSON helpers.

A killed job never leaves a half-written file under its final name, so "the file exists" can mean
"the stage finished".

Files end with the usual permissions, 0666 & ~umask (a shared output_dir stays readable by the
group under umask 002), although `mkstemp` creates them 0600.

Temp files are named `.<target>.tmp-<pid>-<random>@<host>` (`temp_path`). A process killed with
SIGKILL cannot remove its temp file; the next atomic write into the same folder removes every temp
file there whose process is gone (`remove_stale_temps`: same host, PID no longer running). Temp
files of other hosts (a shared file system under SLURM) and of running processes are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_UMASK_LOCK = threading.Lock()
# .<target>.tmp-<pid>[-<random>]@<host>; <host> never holds '@' or '/'.
_TEMP = re.compile(r"^\.(?P<target>.+)\.tmp-(?P<pid>\d+)(?:-[A-Za-z0-9_]+)?@(?P<host>[^@/]+)$")


def current_umask() -> int:
    """This process's umask, read without changing it where Linux allows (/proc/self/status);
    elsewhere set and restored under a lock."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        old = os.umask(0o022)
        os.umask(old)
    return old


def file_mode() -> int:
    """The mode a plain `open(path, "w")` would give a new file: 0666 & ~umask."""
    return 0o666 & ~current_umask()


def _host() -> str:
    return socket.gethostname().replace("/", "_").replace("@", "_") or "localhost"


def temp_path(path: str | os.PathLike[str]) -> Path:
    """A temp name next to `path` for this process, which `remove_stale_temps` recognizes once
    the process is gone (for writers that cannot use `atomic_write`, e.g. a memmap)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}@{_host()}")


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temps(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temp files in `folder` left by processes of this host that are gone (killed
    mid-write); returns what was removed. Never touches another host's or a live process's."""
    folder = Path(folder)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return removed
    host = _host()
    for entry in entries:
        m = _TEMP.match(entry.name) if entry.name.startswith(".") else None
        if m is None or m["host"] != host or _pid_running(int(m["pid"])):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except FileNotFoundError:  # removed meanwhile by another cleaner
            pass
    return removed


def atomic_write(path: str | os.PathLike[str], write: Callable[[Any], None], mode: str = "w") -> None:
    """Call `write(fh)` on a temp file next to `path`, then rename it into place (mode 0666 &
    ~umask). Stale temp files of killed processes in the folder are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.tmp-{os.getpid()}-", suffix=f"@{_host()}", dir=path.parent
    )
    try:
        os.fchmod(fd, file_mode())
        kwargs: dict[str, Any] = {} if "b" in mode else {"encoding": "utf-8"}
        with os.fdopen(fd, mode, **kwargs) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.errno is not None and e.filename in (None, tmp):
            # A write or fsync error names no file (a full disk: Errno 28): name the one meant.
            raise type(e)(e.errno, e.strerror, str(path)) from e
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda fh: fh.write(text))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_jsonl(path: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    def w(fh: Any) -> None:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")

    atomic_write(path, w)


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created, with its folder, if missing) for the block:
    one process at a time on this host, whoever else waits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
