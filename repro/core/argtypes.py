"""argparse `type=` callables that check a numeric flag's range while the command line is parsed.

A value out of range ends in argparse's own one line, which names the flag and the range, and exit
status 2, before anything runs:

    cluster-repro bench cluster: error: argument --n: expected an integer >= 1, got '0'

    p.add_argument("--steps", type=positive_int, default=6)
    p.add_argument("--fraction", type=fraction, default=0.5)
    p.add_argument("--world-sizes", type=int_list(lo=1), default="1,4,8")   # -> [1, 4, 8]
    p.add_argument("--modes", type=str_list(choices=("exact", "fast")), default="exact,fast")

Every list flag is one comma-separated value (`--ks 4,8,16`), never `nargs="+"`
(tests/test_cli_checks.py checks that too).

The ranges are `repro.core.config.builder.Range`, the same that config keys use. Every numeric flag of
every command takes one of these (tests/test_cli_checks.py walks every parser for a bare int or
float).
"""

from __future__ import annotations

import argparse
import math

from repro.core.config.builder import Range


class NumberType:
    """A `type=` for one number in `rng`: int or float (finite). Its message: 'expected <range>'."""

    def __init__(self, rng: Range, integer: bool) -> None:
        self.range = rng
        self.integer = integer
        self.__name__ = "integer" if integer else "number"  # argparse names a type by this

    def describe(self) -> str:
        return self.range.describe(self.integer)

    def __call__(self, text: str) -> int | float:
        value: int | float
        try:
            value = int(text) if self.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}") from None
        if not (math.isfinite(value) and self.range.allows(value)):
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}")
        return value

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


class IntListType:
    """A `type=` for comma-separated integers, each in `rng` -> list[int] (at least one, unless
    `empty_ok`: then "" is the empty list)."""

    def __init__(self, rng: Range, empty_ok: bool = False) -> None:
        self.item = NumberType(rng, integer=True)
        self.empty_ok = empty_ok
        self.__name__ = "integer list"

    def describe(self) -> str:
        return f"comma-separated integers, each {self.item.describe().removeprefix('an integer ')}"

    def __call__(self, text: str) -> list[int]:
        if self.empty_ok and not str(text).strip():
            return []
        parts = [x.strip() for x in str(text).split(",")]
        try:
            if not all(parts):
                raise argparse.ArgumentTypeError("")
            return [int(self.item(x)) for x in parts]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}") from None

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


class StrListType:
    """A `type=` for comma-separated words -> list[str] (at least one), each one of `choices`
    when given."""

    def __init__(self, choices: tuple[str, ...] | None = None) -> None:
        self.choices = tuple(choices) if choices is not None else None
        self.__name__ = "list"

    def describe(self) -> str:
        if self.choices is None:
            return "a comma-separated list"
        return f"a comma-separated list of {', '.join(self.choices)}"

    def __call__(self, text: str) -> list[str]:
        parts = [x.strip() for x in str(text).split(",")]
        if not all(parts) or (self.choices is not None and not set(parts) <= set(self.choices)):
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}")
        return parts

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


def int_range(lo: int | None = None, hi: int | None = None, note: str = "") -> NumberType:
    """Integers in [lo, hi] (None: unbounded on that side)."""
    return NumberType(Range(lo, hi, note=note), integer=True)


def float_range(
    lo: float | None = None,
    hi: float | None = None,
    lo_incl: bool = True,
    hi_incl: bool = True,
    note: str = "",
) -> NumberType:
    """Finite numbers between lo and hi (each bound allowed when its `*_incl`)."""
    return NumberType(Range(lo, hi, lo_incl, hi_incl, note), integer=False)


def int_list(lo: int | None = None, hi: int | None = None, empty_ok: bool = False) -> IntListType:
    """'1,4,8' -> [1, 4, 8], every value in [lo, hi] ('' -> [] when `empty_ok`)."""
    return IntListType(Range(lo, hi), empty_ok)


def str_list(choices: tuple[str, ...] | list[str] | None = None) -> StrListType:
    """'exact,fast' -> ['exact', 'fast'], every word one of `choices` (any word when None)."""
    return StrListType(tuple(choices) if choices is not None else None)


positive_int = int_range(1)
non_negative_int = int_range(0)
rng_seed = int_range(0, 2**32 - 1, note="numpy takes seeds below 2**32")
fraction = float_range(0, 1, lo_incl=False, note="a share: 0.5 is half")
percent = float_range(0, 100, lo_incl=False, note="a percentage: 50 is half")
positive_float = float_range(0, lo_incl=False)
