"""Test programs for code benchmarks whose local copy ships inputs, not assertions (evalplus
MBPP+ and HumanEval+ release files: base_input + plus_input + canonical_solution + atol).

The generated test runs the canonical solution and the candidate on every input (deep-copied, so
neither sees the other's mutations) and requires equal outputs; floats (also inside lists and
tuples) compare with math.isclose(rel_tol=1e-7, abs_tol=atol or 1e-6), as evalplus does. JSON
turns tuples into lists; an input on which the canonical solution itself raises is skipped
(evalplus converts those inputs back to tuples per task instead), so the local MBPP+ can be
slightly easier than evalplus' own scorer on those few tasks (docs/benchmarks.md).
"""

from __future__ import annotations

import json
from typing import Any

_TEMPLATE = """
import copy as _cr_copy, json as _cr_json, math as _cr_math
_cr_inputs = _cr_json.loads({inputs!r})
_cr_ns = {{"__name__": "_cr_reference"}}
exec({reference!r}, _cr_ns)
_cr_ref = _cr_ns[{entry!r}]


def _cr_close(out, exp, atol):
    if isinstance(exp, (list, tuple)) and isinstance(out, (list, tuple)):
        return type(out) is type(exp) and len(out) == len(exp) and all(
            _cr_close(o, e, atol) for o, e in zip(out, exp))
    num = (int, float)
    if isinstance(exp, float) and isinstance(out, num) and not isinstance(out, bool):
        if _cr_math.isnan(exp):
            return isinstance(out, float) and _cr_math.isnan(out)
        return _cr_math.isclose(out, exp, rel_tol=1e-7, abs_tol=atol or 1e-6)
    return out == exp


for _cr_i, _cr_inp in enumerate(_cr_inputs):
    try:
        _cr_exp = _cr_ref(*_cr_copy.deepcopy(_cr_inp))
    except Exception:
        continue
    _cr_out = {entry}(*_cr_copy.deepcopy(_cr_inp))
    assert _cr_close(_cr_out, _cr_exp, {atol!r}), "wrong output on input %d" % _cr_i
"""


def io_test_program(entry_point: str, reference_source: str, inputs: list[Any], atol: float = 0.0) -> str:
    """A test program comparing `entry_point` (defined by the candidate, earlier in the same
    program) with the function of that name in `reference_source` on each input (a list of
    positional arguments)."""
    if not entry_point.isidentifier():
        raise ValueError(f"entry_point {entry_point!r} is not a Python identifier")
    return _TEMPLATE.format(
        inputs=json.dumps(inputs), reference=reference_source, entry=entry_point, atol=float(atol)
    )
