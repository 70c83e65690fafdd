"""EvalPlus's rules for one task's differential test: how a solution's output is compared with the
canonical solution's, and how long each input may take. Both protocols score EvalPlus-format
problems with these rules (evals/evalplus/check.py puts this file's source into every program it
runs in the sandbox), so it uses the standard library only and defines nothing at import time
but constants, functions and one class.

Where each rule comes from (evalplus 0.3.1, the version the authors pin; the code here is the
suite's own, the rules are EvalPlus's):

- `evalplus/eval/__init__.py`, `unsafe_execute`: an output passes when it `==` the expected one;
  for MBPP, the special oracles below replace or extend that; for HumanEval/32 (`find_zero`) only
  |poly(xs, out)| <= atol counts. When atol is 0 and the expected output is a float (or a
  non-empty list or tuple of floats), atol becomes 1e-6 and stays so for the task's later inputs.
  An output that is not `==` under a non-zero atol must have the expected output's type (and
  length, for a list or tuple) and be numpy.allclose to it with rtol 1e-7 (`_allclose` below
  restates numpy.allclose for numbers and nested lists of numbers).
- `evalplus/eval/_special_oracle.py`: set comparison for the 8 MBPP tasks of
  `MBPP_OUTPUT_SET_EQ_TASKS`; "is not None" for the 3 of `MBPP_OUTPUT_NOT_NONE_TASKS` (their
  canonical solutions return an `re.Match`, which `==` compares by identity); Mbpp/581
  (`surface_Area`: the height is the pyramid's own), Mbpp/558 (`digit_distance_nums`: pad the
  shorter number with zeros), HumanEval/32 (the polynomial's value); and in `unsafe_execute`,
  Mbpp/164 (`are_equivalent`: every output passes) and Mbpp/295 (`sum_div`: 0 also passes).
- `evalplus/config.py` and `untrusted_check`: each input's time limit is
  max(1 s, 4 x the canonical solution's time on it) (`DEFAULT_MIN_TIME_LIMIT`,
  `DEFAULT_GT_TIME_LIMIT_FACTOR`), and the task's under min(60 s, the sum of the limits) + 1 s
  (+ the 1 s the parent process waits in `untrusted_check`'s join). One difference, so that a
  verdict does not depend on the machine's load: EvalPlus's 60 s cap (`EVALPLUS_TIMEOUT_PER_TASK`)
  is raised to 4 x the canonical solution's total time when that is more (a slow machine slows
  the reference as much as the solution; on an idle machine the cap only binds tasks whose
  reference takes over 15 s).
"""

import math

# evalplus/config.py: DEFAULT_GT_TIME_LIMIT_FACTOR, DEFAULT_MIN_TIME_LIMIT (seconds).
TIME_LIMIT_FACTOR = 4.0
MIN_TIME_LIMIT_S = 1.0
# evalplus/eval/__init__.py untrusted_check: EVALPLUS_TIMEOUT_PER_TASK's default (seconds), and
# the 1 s added to the task's limit plus the 1 s its join waits.
TASK_TIMEOUT_S = 60.0
TASK_SLACK_S = 2.0

# evalplus/eval/_special_oracle.py, by entry point.
MBPP_OUTPUT_NOT_NONE = ("check_str", "text_match_three", "text_starta_endb")
MBPP_OUTPUT_SET_EQ = (
    "similar_elements",  # Mbpp/2
    "find_char_long",  # Mbpp/7
    "common_in_nested_lists",  # Mbpp/111
    "extract_singly",  # Mbpp/140
    "larg_nnum",  # Mbpp/232
    "intersection_array",  # Mbpp/249
    "find_dissimilar",  # Mbpp/579
    "Diff",  # Mbpp/769
)


def time_limits(reference_times, factor=TIME_LIMIT_FACTOR, floor=MIN_TIME_LIMIT_S):
    """Each input's limit (seconds): max(floor, factor x the canonical solution's time on it)."""
    return [max(floor, factor * t) for t in reference_times]


def task_budget(reference_times, factor=TIME_LIMIT_FACTOR, floor=MIN_TIME_LIMIT_S):
    """The whole task's limit (seconds): min(cap, the sum of the inputs' limits) + 2 s, where cap
    is EvalPlus's 60 s, or factor x the canonical solution's total time when that is more."""
    cap = max(TASK_TIMEOUT_S, factor * sum(reference_times))
    return min(cap, sum(time_limits(reference_times, factor, floor))) + TASK_SLACK_S


def expected_outputs(dataset, entry, outputs):
    """The canonical solution's outputs as the comparison expects them: for the "is not None"
    tasks of MBPP, whether each output is not None."""
    if dataset == "mbpp" and entry in MBPP_OUTPUT_NOT_NONE:
        return [o is not None for o in outputs]
    return list(outputs)


def is_floats(x):
    """A float, or a non-empty list or tuple of floats (EvalPlus's `is_floats`)."""
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
    """numpy.allclose(a, b, rtol, atol) on numbers and equally shaped nested lists of numbers
    (NaN is never close, as numpy's default)."""
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
        if isinstance(u, float) and math.isnan(u) or isinstance(v, float) and math.isnan(v):
            return False
        if abs(u - v) > atol + rtol * abs(v):
            return False
    return True


def _pyramid_surface(base_edge, height):
    """Mbpp/581's oracle: the surface of a square pyramid of that base edge and height."""
    slant = math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 2 * base_edge * slant)


def _digit_distance(a, b):
    """Mbpp/558's oracle: the digit-wise distance, the shorter number padded with zeros."""
    sa, sb = str(a), str(b)
    n = max(len(sa), len(sb))
    return sum(abs(int(x) - int(y)) for x, y in zip(sa.zfill(n), sb.zfill(n)))


def _poly_at(xs, x):
    """HumanEval/32's oracle: the polynomial with coefficients xs at x."""
    return sum(c * math.pow(x, i) for i, c in enumerate(xs))


class Comparator:
    """One task's output comparison (dataset "mbpp" or "humaneval", for the special oracles).
    `check` raises AssertionError when an output does not pass; atol may rise to 1e-6 on a float
    output and then stays so for the task's later inputs, as in EvalPlus."""

    def __init__(self, dataset, entry, atol):
        self.dataset, self.entry, self.atol = dataset, entry, float(atol)

    def check(self, out, exp, inp):
        """Raise AssertionError unless `out` (the solution's output on `inp`) passes against
        `exp` (the canonical solution's, from expected_outputs)."""
        entry, atol = self.entry, self.atol
        exact = out == exp
        if self.dataset == "mbpp":
            if entry == "are_equivalent":
                exact = True
            elif entry == "sum_div":
                exact = exact or out == 0
            elif entry == "surface_Area":
                exact = exact or abs(out - _pyramid_surface(*inp)) <= atol
            elif entry == "digit_distance_nums":
                exact = exact or out == _digit_distance(*inp)
            elif entry in MBPP_OUTPUT_SET_EQ:
                exact = set(out) == set(exp)
            elif entry in MBPP_OUTPUT_NOT_NONE:
                exact = out == exp if isinstance(out, bool) else exp == (out is not None)
        if self.dataset == "humaneval" and entry == "find_zero":
            assert abs(_poly_at(*inp, out)) <= atol, "find_zero: the polynomial is not 0 there"
            return
        if atol == 0 and is_floats(exp):
            self.atol = atol = 1e-6
        if not exact and atol != 0:
            assert type(out) is type(exp), f"type {type(out).__name__}, expected {type(exp).__name__}"
            if isinstance(exp, (list, tuple)):
                assert len(out) == len(exp), f"length {len(out)}, expected {len(exp)}"
            assert _allclose(out, exp, 1e-07, atol), "not close to the expected output"
        else:
            assert exact, "not equal to the expected output"
