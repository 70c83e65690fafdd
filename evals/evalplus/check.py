"""EvalPlus's differential test of one solution on one set of inputs, in the sandbox, in two runs.

EvalPlus (evalplus==0.3.1) runs the canonical solution on every input (the expected outputs and
how long each took), then the solution on the same inputs, each under a limit set from the
canonical solution's time, stopping at the first failure. Both protocols score EvalPlus-format
problems this way (the evalplus protocol and, for MBPP+ and HumanEval+ release files, the lm-eval
protocol's `process_results`), with the rules of evals/evalplus/compare.py, whose source every
program here embeds (standard library only: the sandbox's interpreter may have nothing else):

1. `reference_timing`: the canonical solution alone, in the sandbox, on every input: its time on
   each, in seconds. Once per task and input set in an evaluation (`clear_reference_timings` at
   its start), so the times are of this machine at this time: a busier machine slows the
   reference as much as the solutions it times. A reference that does not finish within
   `reference_timeout_s()` marks the task `reference_timeout`: it is left out of the score, never
   counted as the model's timeout.
2. `check_solution`: one program that recomputes the expected outputs with the canonical solution,
   then runs the solution on every input under max(1 s, 4 x the reference's time) each, the set
   under the task's limit (evals/evalplus/compare.py task_budget), and exits 0 exactly when every
   input passes. Its sandbox limits follow from the same times.

Inputs on which the canonical solution raises fail the task under EvalPlus (its inputs are the
deserialized ones); the lm-eval protocol reads JSON inputs without EvalPlus's deserializer and
skips those inputs instead (`skip_reference_errors`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import os
import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.evalplus import compare as rules
from evals.sandbox import ExecResult, Limits, run_program

COMPARATOR_SOURCE = Path(rules.__file__).read_text(encoding="utf-8")
MEMORY_BYTES = 4 << 30  # EvalPlus's limit (EVALPLUS_MAX_MEMORY_BYTES' default)
# How long the canonical solution may take on all of a task's inputs before the task is marked
# `reference_timeout` (seconds; $CLUSTER_REPRO_REFERENCE_TIMEOUT overrides it). EvalPlus has no
# such limit (a looping reference hangs its evaluation); this one only has to stay above what
# the slowest real reference (MBPP+'s Mbpp/599) takes on a loaded machine.
REFERENCE_TIMEOUT_S = 600.0
# The expected outputs are recomputed in the check's program under max(this, 4 x the measured
# total) seconds (at most reference_timeout_s()).
MIN_RECOMPUTE_S = 10.0
SANDBOX_GRACE_S = 5.0  # interpreter start and teardown, beyond the program's own limits
REFERENCE_TIMEOUT_EXIT = 3  # the check program's exit status when the reference ran out of time
REFERENCE_TIMEOUT = "reference_timeout"  # the verdict on a task whose reference never finished
_TIMES_MARK = "REFERENCE_TIMES "

_PRELUDE = r'''
import base64 as _b64, copy as _copy, json as _json, os as _os, pickle as _pickle
import signal as _signal, sys as _sys, time as _time

_P = _pickle.loads(_b64.b64decode(_PAYLOAD))
del _PAYLOAD


def _fail(why, status=1):
    _sys.__stderr__.write(why + "\n")
    _sys.__stderr__.flush()
    _os._exit(status)


class _Quiet:
    """stdout/stderr to nowhere and no stdin while task code runs (EvalPlus's swallow_io)."""

    def __enter__(self):
        self.saved = (_sys.stdout, _sys.stderr, _sys.stdin)
        sink = open(_os.devnull, "w")
        _sys.stdout = _sys.stderr = sink
        _sys.stdin = open(_os.devnull)
        return self

    def __exit__(self, *exc):
        _sys.stdout, _sys.stderr, _sys.stdin = self.saved
        return False
'''

_REFERENCE_PROGRAM = r"""
_ns = {}
with _Quiet():
    exec(_P["reference"], _ns)
_ref = _ns[_P["entry"]]
_times, _skipped = [], []
for _i, _inp in enumerate(_P["inputs"]):
    _x = _copy.deepcopy(_inp)
    _t0 = _time.perf_counter()
    try:
        with _Quiet():
            _ref(*_x)
    except BaseException as _e:
        if not _P["skip_errors"]:
            _fail("REFERENCE FAILED on input %d: %r" % (_i, _e))
        _skipped.append(_i)
        _times.append(0.0)
        continue
    _times.append(_time.perf_counter() - _t0)
_sys.__stdout__.write("\n" + _P["mark"] + _json.dumps({"times": _times, "skipped": _skipped}) + "\n")
_sys.__stdout__.flush()
"""

_CHECK_PROGRAM = r"""
_C = {"__name__": "evalplus_compare"}
exec(_P["comparator"], _C)


class _CheckTimeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _CheckTimeout()


_signal.signal(_signal.SIGALRM, _on_alarm)


def _arm(seconds):
    if seconds <= 0:
        raise _CheckTimeout()
    _signal.setitimer(_signal.ITIMER_REAL, seconds)


def _disarm():
    _signal.setitimer(_signal.ITIMER_REAL, 0)


_entry, _dataset, _scored = _P["entry"], _P["dataset"], _P["scored"]
# The expected outputs: the canonical solution again, on copies, under its own limit.
try:
    _arm(_P["recompute_s"])
    _ref_ns = {}
    with _Quiet():
        exec(_P["reference"], _ref_ns)
        _ref = _ref_ns[_entry]
        _expected = [_ref(*_copy.deepcopy(_P["inputs"][_i])) for _i in _scored]
    _disarm()
except _CheckTimeout:
    _fail("REFERENCE TIMEOUT: the canonical solution did not finish again in %.1f s" % _P["recompute_s"],
          _P["reference_timeout_exit"])
except BaseException as _e:
    _disarm()
    _fail("REFERENCE FAILED: the canonical solution raised %r" % (_e,))
_expected = _C["expected_outputs"](_dataset, _entry, _expected)
_cmp = _C["Comparator"](_dataset, _entry, _P["atol"])
_deadline = _time.time() + _P["budget"]


def _left():
    return _deadline - _time.time()


try:
    _arm(_left())
    _ns = {}
    with _Quiet():
        exec(_P["solution"], _ns)
    _fn = _ns[_entry]
    _disarm()
except _CheckTimeout:
    _fail("TIMEOUT while defining the solution")
except BaseException as _e:
    _disarm()
    _fail("the solution does not define %s: %r" % (_entry, _e))

for _k, _i in enumerate(_scored):
    _inp = _P["inputs"][_i]
    # The solution gets a deep copy as the reference did: the same objects, built the same way
    # (a list's allocated size, which sys.getsizeof reports, depends on how it was built).
    _args = _copy.deepcopy(_inp)
    try:
        _arm(min(_P["limits"][_k], _left()))
        with _Quiet():
            _out = _fn(*_args)
        _disarm()
        _cmp.check(_out, _expected[_k], _inp)
    except _CheckTimeout:
        _fail("TIMEOUT on input %d" % _i)
    except BaseException as _e:
        _disarm()
        _fail("FAILED on input %d: %r" % (_i, _e))
"""


def _program(body: str, payload: dict[str, Any]) -> str:
    blob = base64.b64encode(pickle.dumps(payload, protocol=4)).decode("ascii")
    return f"_PAYLOAD = {blob!r}\n" + _PRELUDE + body


def _check_entry(entry_point: str) -> None:
    if not entry_point.isidentifier():
        raise ValueError(f"entry_point {entry_point!r} is not a Python identifier")


def reference_timeout_s() -> float:
    """The canonical solution's limit on all of a task's inputs (seconds): REFERENCE_TIMEOUT_S,
    or $CLUSTER_REPRO_REFERENCE_TIMEOUT."""
    raw = os.environ.get("CLUSTER_REPRO_REFERENCE_TIMEOUT")
    if raw is None:
        return REFERENCE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"CLUSTER_REPRO_REFERENCE_TIMEOUT={raw!r}: expected a number of seconds > 0")
    return value


@dataclass(frozen=True)
class ReferenceTiming:
    """The canonical solution's run on a task's inputs. status: ok, reference_timeout (it did not
    finish in reference_timeout_s()), failed (it raised on an input that is not skipped) or error
    (the sandbox did not run it). `times[i]`: seconds on input i (0 for a skipped input)."""

    status: str
    times: tuple[float, ...] = ()
    skipped: tuple[int, ...] = ()
    reason: str = ""

    def scored(self) -> list[int]:
        """The inputs a solution is tested on: all but those the reference raised on."""
        skip = set(self.skipped)
        return [i for i in range(len(self.times)) if i not in skip]

    def scored_times(self) -> list[float]:
        return [self.times[i] for i in self.scored()]


_TIMINGS: dict[str, ReferenceTiming] = {}
_TIMINGS_LOCK = threading.Lock()


def clear_reference_timings() -> None:
    """Forget the measured reference times: an evaluation starts with this, so that its limits
    come from its own measurements (on the machine as loaded as it is now)."""
    with _TIMINGS_LOCK:
        _TIMINGS.clear()


def reference_program(reference: str, entry_point: str, inputs: list[Any], skip_errors: bool = False) -> str:
    """The program that runs `reference` on every input and prints its per-input seconds."""
    _check_entry(entry_point)
    payload = {
        "reference": reference,
        "entry": entry_point,
        "inputs": inputs,
        "skip_errors": skip_errors,
        "mark": _TIMES_MARK,
    }
    return _program(_REFERENCE_PROGRAM, payload)


def reference_timing(
    reference: str,
    entry_point: str,
    inputs: list[Any],
    skip_errors: bool = False,
    runner: Callable[[str, Limits], ExecResult] = run_program,
) -> ReferenceTiming:
    """The canonical solution's times on `inputs`, measured in the sandbox (once per evaluation:
    later calls with the same task and inputs reuse them)."""
    key = hashlib.sha256(pickle.dumps((reference, entry_point, inputs, skip_errors), protocol=4)).hexdigest()
    with _TIMINGS_LOCK:
        known = _TIMINGS.get(key)
    if known is not None:
        return known
    limit = reference_timeout_s()
    limits = Limits(
        timeout_s=limit,
        cpu_s=math.ceil(limit) + 1,
        memory_bytes=MEMORY_BYTES,
        output_tail_bytes=1 << 20,
        max_file_bytes=8 << 20,
    )
    r = runner(reference_program(reference, entry_point, inputs, skip_errors), limits)
    if r.status == "timeout":
        timing = ReferenceTiming(
            REFERENCE_TIMEOUT, reason=f"the canonical solution did not finish in {limit:g} s"
        )
    elif r.status != "passed":
        last = [ln for ln in r.stderr_tail.strip().splitlines() if ln.strip()]
        status = "error" if r.status == "error" else "failed"
        timing = ReferenceTiming(status, reason=last[-1][:300] if last else f"exit status {r.returncode}")
    else:
        line = next((ln for ln in r.stdout_tail.splitlines() if ln.startswith(_TIMES_MARK)), None)
        if line is None:
            return ReferenceTiming("error", reason="the reference's times were not printed")
        got = json.loads(line[len(_TIMES_MARK) :])
        timing = ReferenceTiming("ok", tuple(got["times"]), tuple(got["skipped"]))
    if timing.status != "error":  # a harness failure is tried again
        with _TIMINGS_LOCK:
            _TIMINGS[key] = timing
    return timing


def check_program(
    solution: str,
    reference: str,
    entry_point: str,
    inputs: list[Any],
    atol: float,
    dataset: str,
    timing: ReferenceTiming,
) -> str:
    """The program that exits 0 exactly when `solution` passes EvalPlus's differential test
    against `reference` on the inputs `timing` scores (`dataset`: "mbpp" or "humaneval", for
    the special oracles), under the limits `timing` gives."""
    _check_entry(entry_point)
    times = timing.scored_times()
    payload = {
        "comparator": COMPARATOR_SOURCE,
        "solution": solution,
        "reference": reference,
        "entry": entry_point,
        "inputs": inputs,
        "scored": timing.scored(),
        "atol": float(atol),
        "dataset": dataset,
        "limits": rules.time_limits(times),
        "budget": rules.task_budget(times),
        "recompute_s": recompute_s(timing),
        "reference_timeout_exit": REFERENCE_TIMEOUT_EXIT,
    }
    return _program(_CHECK_PROGRAM, payload)


def recompute_s(timing: ReferenceTiming) -> float:
    """How long the check's program may take to recompute the expected outputs (seconds)."""
    total = sum(timing.scored_times())
    return min(reference_timeout_s(), max(MIN_RECOMPUTE_S, rules.TIME_LIMIT_FACTOR * total))


def check_limits(timing: ReferenceTiming) -> Limits:
    """The sandbox's limits for the check's program: the recomputation, the task's limit and a
    grace for the interpreter, in wall-clock and CPU seconds; EvalPlus's 4 GiB."""
    wall = recompute_s(timing) + rules.task_budget(timing.scored_times()) + SANDBOX_GRACE_S
    return Limits(timeout_s=wall, cpu_s=math.ceil(wall), memory_bytes=MEMORY_BYTES)


def check_solution(
    solution: str,
    reference: str,
    entry_point: str,
    inputs: list[Any],
    atol: float,
    dataset: str,
    skip_reference_errors: bool = False,
    runner: Callable[[str, Limits], ExecResult] = run_program,
) -> ExecResult:
    """EvalPlus's verdict on `solution`: an ExecResult whose status is passed, failed, timeout
    (the sandbox's backstop), error (the harness), or reference_timeout (the canonical solution
    did not finish: not the solution's fault; leave the task out of the score)."""
    timing = reference_timing(reference, entry_point, inputs, skip_reference_errors, runner)
    if timing.status != "ok":
        why = f"REFERENCE {timing.status.removeprefix('reference_').upper()}: {timing.reason}"
        status = timing.status if timing.status in (REFERENCE_TIMEOUT, "error") else "failed"
        return ExecResult(status, None, 0.0, "", why)
    program = check_program(solution, reference, entry_point, inputs, atol, dataset, timing)
    r = runner(program, check_limits(timing))
    ran_out = r.returncode == REFERENCE_TIMEOUT_EXIT and "REFERENCE TIMEOUT" in r.stderr_tail
    if r.status == "failed" and ran_out:  # the recomputation, not the solution, ran out of time
        return dataclasses.replace(r, status=REFERENCE_TIMEOUT)
    return r


def excluded_tasks_note(reference_timeouts: list[str]) -> dict[str, Any]:
    """An entry's record of the tasks left out of its score (none: nothing)."""
    if not reference_timeouts:
        return {}
    return {
        "excluded_tasks": {REFERENCE_TIMEOUT: list(reference_timeouts)},
        "note": (
            f"{len(reference_timeouts)} task(s) left out of the score: their canonical solution did "
            f"not finish in {reference_timeout_s():g} s ({REFERENCE_TIMEOUT}): "
            + ", ".join(reference_timeouts)
        ),
    }
