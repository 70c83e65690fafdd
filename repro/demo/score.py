"""Scoring a model's response to a demo-pool task (repro/demo/pool.py): exact match on the
first line, normalized, or, for `python_function`, the extracted function run against its assert
statements in an isolated, resource-limited subprocess: `score_generation`, `extract_code` and
`run_python_tests`.
"""

from __future__ import annotations

import math
import os
import re
import resource  # Unix-only, like the rest of the pipeline; imported here, not in the forked child
import signal
import subprocess
import sys
import tempfile

from repro.core.errors import UserValueError


def _normalize(s: str, case_sensitive: bool = False) -> str:
    """Strip, collapse whitespace, canonical ', ' in lists, drop trailing '.', lower-case."""
    s = " ".join(s.split())
    s = re.sub(r"\s*,\s*", ", ", s)
    s = re.sub(r"\[\s+", "[", re.sub(r"\s+\]", "]", s))
    s = s.rstrip(".").strip()
    return s if case_sensitive else s.lower()


def extract_code(generation: str) -> str:
    """The code of a response: the first ``` fenced block if any, then from the first top-level
    `import`/`def` line through the end of the function (the first unindented line that is not
    another `def`/decorator ends it, so trailing prose or example calls are dropped)."""
    m = re.search(r"```[^\n]*\n(.*?)(```|$)", generation, re.S)
    text = m.group(1) if m else generation
    lines, out, in_def = text.splitlines(), [], False
    for line in lines:
        top = line[:1] not in (" ", "\t", "")
        if in_def and top and not line.startswith(("def ", "@")):
            break
        if line.startswith("def "):
            in_def = True
        if in_def or re.match(r"(import \w|from [\w.]+ import )", line):
            out.append(line)
    return "\n".join(out).strip() + "\n" if in_def else ""


def _limit_resources(cpu_s: int, mem_bytes: int) -> None:  # runs in the child, before exec
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))


def run_python_tests(code: str, tests: list[str], timeout_s: float = 5.0, mem_bytes: int = 1 << 30) -> bool:
    """True if `code` followed by `tests` exits 0 in an isolated `python -I` subprocess.

    Limits: wall clock `timeout_s` seconds (the whole process group is killed after it),
    CPU seconds ceil(timeout_s)+1, address space `mem_bytes` (default 1 GiB); stdin closed,
    output discarded, a fresh temp dir as cwd and a minimal environment. An interpreter that
    cannot start raises (OSError) rather than scoring 0.0: that is a setup fault, not a wrong
    answer."""
    program = code + "\n\n" + "\n".join(tests) + "\n"
    env = {k: os.environ[k] for k in ("PATH", "LD_LIBRARY_PATH", "SYSTEMROOT") if k in os.environ}
    cpu_s = math.ceil(timeout_s) + 1
    with tempfile.TemporaryDirectory(prefix="demo_score_") as tmp:
        with open(os.path.join(tmp, "prog.py"), "w", encoding="utf-8") as fh:
            fh.write(program)
        proc = subprocess.Popen(
            [sys.executable, "-I", "prog.py"],
            cwd=tmp,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lambda: _limit_resources(cpu_s, mem_bytes),
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:  # kill the group: also anything the code forked, even after a normal exit
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    return rc == 0


def score_generation(meta: dict, generation: str, timeout_s: float = 5.0) -> float:
    """1.0 if the generated response is right, else 0.0.

    exact: the first non-empty line of `generation`, normalized (see `_normalize`; case kept when
    meta["case_sensitive"]), must equal the normalized meta["answer"]. python: the extracted
    function plus meta["tests"] must pass within `timeout_s` seconds (see `run_python_tests`)."""
    if meta["check"] == "python":
        code = extract_code(generation)
        if not code:
            return 0.0
        return 1.0 if run_python_tests(code, meta["tests"], timeout_s) else 0.0
    if meta["check"] != "exact":
        raise UserValueError(f"unknown check {meta['check']!r} (expected 'exact' or 'python')")
    first = generation.strip().split("\n", 1)[0]
    cs = bool(meta.get("case_sensitive", False))
    return 1.0 if first and _normalize(first, cs) == _normalize(meta["answer"], cs) else 0.0
