"""A page opened in headless Chromium (Debian's `chromium`, which .ci/run installs), driven over
the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages ending in NUL on file
descriptors 3 and 4), so no client library is needed.

`open_page(path, script)` loads a local file, collects every console error, uncaught exception
and browser log error, then evaluates `script` (a JavaScript expression) in the page and returns
its value with the errors.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = "chromium"


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int) -> None:
        self.proc, self.w, self.r = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
                self.buf += chunk
        msg, _, self.buf = self.buf.partition(b"\0")
        return json.loads(msg)

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30,
    ) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while True:
            e = self._read(deadline)
            if e.get("method") == method:
                return e
            self.events.append(e)


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            out.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(f"console.{p.get('type')}: {[a.get('value') for a in p.get('args', [])]}")
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append(f"log: {p['entry'].get('text')} ({p['entry'].get('url')})")
    return out


def open_page(path: Path, script: str, timeout: float = 60) -> tuple[Any, list[str]]:
    """Load `path` in headless Chromium; (the value of `script` evaluated in the page, the
    console errors, exceptions and log errors seen while it loaded)."""
    exe = shutil.which(CHROMIUM)
    if exe is None:
        raise AssertionError(
            "chromium is not installed: install Debian's package (apt-get install chromium; .ci/run does)"
        )
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    profile = tempfile.mkdtemp(prefix="cluster-repro-chromium-")

    def fds() -> None:  # the browser reads commands on fd 3 and writes its answers on fd 4
        import fcntl

        r, w = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
        os.dup2(r, 3)
        os.dup2(w, 4)

    proc = subprocess.Popen(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        preexec_fn=fds,
        pass_fds=(3, 4),  # kept open in the browser (preexec_fn puts the pipes there)
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(to_r)
    os.close(from_w)
    pipe = _Pipe(proc, to_w, from_r)
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.events.clear()
        pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        pipe.wait_for("Page.loadEventFired", timeout=timeout)
        value = pipe.send(
            "Runtime.evaluate",
            {"expression": script, "returnByValue": True, "awaitPromise": True},
            session=session,
        )
        if "exceptionDetails" in value:
            raise AssertionError(f"the check script failed: {value['exceptionDetails']}")
        return value["result"].get("value"), _errors(pipe.events)
    finally:
        try:
            pipe.send("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(to_w)
        os.close(from_r)
        shutil.rmtree(profile, ignore_errors=True)
