"""The program that scores one solution on one set of EvalPlus inputs, inside the sandbox.

EvalPlus (evalplus==0.3.1, `evalplus/evaluate.py` and `evalplus/eval/__init__.py`) scores a
solution by differential testing: it runs the canonical solution on every input (the expected
outputs, and how long each took), then the solution on the same inputs, each under a time limit of
max(1 s, 4 x the canonical solution's time), the whole set under min(60 s, the sum of the limits)
+ about 2 s, stopping at the first failure. Outputs compare by `==`, floats (and lists or tuples of
floats) with a tolerance (atol, at least 1e-6 for floats; rtol 1e-7), and a few tasks by their own
oracles. This module writes a self-contained program that does the same (standard library only:
the sandbox's interpreter may have nothing else) and exits 0 exactly when every input passes.
Those rules are EvalPlus's; the code is ours (docs/benchmarks.md cites the files).
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

# EvalPlus 0.3.1's special oracles, by entry point (evalplus/eval/_special_oracle.py).
MBPP_OUTPUT_NOT_NONE = ("check_str", "text_match_three", "text_starta_endb")
MBPP_OUTPUT_SET_EQ = (
    "similar_elements",
    "find_char_long",
    "common_in_nested_lists",
    "extract_singly",
    "larg_nnum",
    "intersection_array",
    "find_dissimilar",
    "Diff",
)

_PROGRAM = r'''
import base64 as _b64, copy as _copy, math as _math, os as _os, pickle as _pickle, signal as _signal
import sys as _sys, time as _time

_P = _pickle.loads(_b64.b64decode(__PAYLOAD__))
del __PAYLOAD_NAME__


class _CheckTimeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _CheckTimeout()


_signal.signal(_signal.SIGALRM, _on_alarm)


def _fail(why):
    _sys.__stderr__.write(why + "\n")
    _sys.__stderr__.flush()
    _os._exit(1)


class _Quiet:
    """stdout/stderr to nowhere and no stdin while a solution runs (EvalPlus's swallow_io)."""

    def __enter__(self):
        self.saved = (_sys.stdout, _sys.stderr, _sys.stdin)
        sink = open(_os.devnull, "w")
        _sys.stdout = _sys.stderr = sink
        _sys.stdin = open(_os.devnull)
        return self

    def __exit__(self, *exc):
        _sys.stdout, _sys.stderr, _sys.stdin = self.saved
        return False


# The reference: expected outputs and their times (EvalPlus's ground truth, on copies).
_ref_ns = {}
exec(_P["reference"], _ref_ns)
_ref = _ref_ns[_P["entry"]]
_expected, _times = [], []
try:
    for _inp in _P["inputs"]:
        _x = _copy.deepcopy(_inp)
        _t0 = _time.time()
        with _Quiet():
            _out = _ref(*_x)
        _times.append(_time.time() - _t0)
        _expected.append(_out)
except BaseException as _e:
    _fail("REFERENCE FAILED: the canonical solution raised %r" % (_e,))
if _P["dataset"] == "mbpp" and _P["entry"] in _P["not_none"]:
    _expected = [_o is not None for _o in _expected]
_limits = [max(_P["min_time"], _P["factor"] * _t) for _t in _times]
_deadline = _time.time() + min(_P["task_timeout"], sum(_limits)) + 2.0


def _left():
    return _deadline - _time.time()


def _arm(seconds):
    if seconds <= 0:
        raise _CheckTimeout()
    _signal.setitimer(_signal.ITIMER_REAL, seconds)


def _disarm():
    _signal.setitimer(_signal.ITIMER_REAL, 0)


def _is_floats(x):
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False


def _flat(x):
    if isinstance(x, (list, tuple)):
        out = []
        for i in x:
            out.extend(_flat(i))
        return out
    return [x]


def _shape(x):
    if isinstance(x, (list, tuple)):
        return (len(x),) + (_shape(x[0]) if x else ())
    return ()


def _allclose(a, b, rtol, atol):
    """numpy.allclose on numbers and equally shaped lists of numbers (NaN never close)."""
    if _shape(a) != _shape(b):
        return False
    fa, fb = _flat(a), _flat(b)
    if len(fa) != len(fb):
        return False
    for u, v in zip(fa, fb):
        if not isinstance(u, (int, float, complex)) or not isinstance(v, (int, float, complex)):
            return False
        if u == v:
            continue
        if isinstance(u, float) and _math.isnan(u) or isinstance(v, float) and _math.isnan(v):
            return False
        if abs(u - v) > atol + rtol * abs(v):
            return False
    return True


def _pyramid_surface(base_edge, height):  # Mbpp/581: the height is the pyramid's own
    slant = _math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 2 * base_edge * slant)


def _digit_distance(a, b):  # Mbpp/558: pad the shorter number with leading zeros
    sa, sb = str(a), str(b)
    n = max(len(sa), len(sb))
    return sum(abs(int(x) - int(y)) for x, y in zip(sa.zfill(n), sb.zfill(n)))


def _poly_at(xs, x):  # HumanEval/32
    return sum(c * _math.pow(x, i) for i, c in enumerate(xs))


_entry, _dataset, _atol = _P["entry"], _P["dataset"], _P["atol"]
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

for _i, _inp in enumerate(_P["inputs"]):
    try:
        _arm(min(_limits[_i], _left()))
        with _Quiet():
            _out = _fn(*_inp)
        _disarm()
        _exp = _expected[_i]
        _exact = _out == _exp
        if _dataset == "mbpp":
            if _entry == "are_equivalent":
                _exact = True
            elif _entry == "sum_div":
                _exact = _exact or _out == 0
            elif _entry == "surface_Area":
                _exact = _exact or abs(_out - _pyramid_surface(*_inp)) <= _atol
            elif _entry == "digit_distance_nums":
                _exact = _exact or _out == _digit_distance(*_inp)
            elif _entry in _P["set_eq"]:
                _exact = set(_out) == set(_exp)
            elif _entry in _P["not_none"]:
                _exact = _out == _exp if isinstance(_out, bool) else _exp == (_out is not None)
        if _dataset == "humaneval" and _entry == "find_zero":
            assert abs(_poly_at(*_inp, _out)) <= _atol
            continue
        if _atol == 0 and _is_floats(_exp):
            _atol = 1e-6  # kept for the later inputs, as EvalPlus does
        if not _exact and _atol != 0:
            assert type(_out) == type(_exp)
            if isinstance(_exp, (list, tuple)):
                assert len(_out) == len(_exp)
            assert _allclose(_out, _exp, 1e-07, _atol)
        else:
            assert _exact
    except _CheckTimeout:
        _fail("TIMEOUT on input %d" % _i)
    except BaseException as _e:
        _disarm()
        _fail("FAILED on input %d: %r" % (_i, _e))
'''


def check_program(
    solution: str,
    reference: str,
    entry_point: str,
    inputs: list[Any],
    atol: float,
    dataset: str,
    min_time_limit: float = 1.0,
    time_limit_factor: float = 4.0,
    task_timeout: float = 60.0,
) -> str:
    """The program that exits 0 exactly when `solution` passes EvalPlus's differential test
    against `reference` on `inputs` (`dataset`: "mbpp" or "humaneval", for the special oracles)."""
    if not entry_point.isidentifier():
        raise ValueError(f"entry_point {entry_point!r} is not a Python identifier")
    payload = {
        "solution": solution,
        "reference": reference,
        "entry": entry_point,
        "inputs": inputs,
        "atol": float(atol),
        "dataset": dataset,
        "not_none": MBPP_OUTPUT_NOT_NONE,
        "set_eq": MBPP_OUTPUT_SET_EQ,
        "min_time": float(min_time_limit),
        "factor": float(time_limit_factor),
        "task_timeout": float(task_timeout),
    }
    blob = base64.b64encode(pickle.dumps(payload, protocol=4)).decode("ascii")
    return f"_PAYLOAD = {blob!r}\n" + _PROGRAM.replace("__PAYLOAD__", "_PAYLOAD").replace(
        "__PAYLOAD_NAME__", "_PAYLOAD"
    )
