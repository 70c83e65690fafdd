"""The generated demo pool: short, checkable instruction tasks, built from a seed (no downloads).

`generate_demo_pool` returns training rows with a category mix skewed on purpose (by default the
rarest category is 5% of the pool and the commonest 30%: `category_shares`) and planted
near/exact duplicates (so data selection has something to find), plus held-out rows that share no
underlying problem with training (the same number per category, however rare it is in training).
`score_generation` (repro/demo/score.py) checks a model's response: exact-match on the first
line, or, for `python_function`, running the code against assert statements in a
resource-limited subprocess. The data source around it is repro/demo/source.py.

Everything random comes from one `random.Random(seed)`, so the same arguments give byte-identical
rows (never the global `random` module or `hash()`, which varies per process).
"""

from __future__ import annotations

import copy
import difflib
import math
import random
import re
from collections.abc import Callable
from typing import Any

from repro.core.errors import UserValueError

__all__ = [
    "CATEGORIES",
    "DEFAULT_MAX_SHARE",
    "DEFAULT_MIN_SHARE",
    "category_counts",
    "category_shares",
    "generate_demo_pool",
]

CATEGORIES: tuple[str, ...] = (
    "add",
    "subtract",
    "multiply",
    "reverse_string",
    "uppercase",
    "count_vowels",
    "sort_list",
    "list_max",
    "unit_conversion",
    "parity",
    "word_count",
    "python_function",
)

# The default skew of the training pool: the rarest category's share and the commonest's.
DEFAULT_MIN_SHARE = 0.05
DEFAULT_MAX_SHARE = 0.30
_NEAR_DUP_FRACTION = 0.05  # of n_train, planted near-copies
_EXACT_DUP_FRACTION = 0.01  # of n_train, planted exact copies
_MAX_TRIES = 2000  # rejection-sampling attempts per row before giving up

_WORDS = tuple(
    (
        "apple river stone green light table music cloud dream house tiger ocean pencil garden window "
        "summer winter orange planet silver rabbit forest candle bridge castle dragon yellow market "
        "little simple number letter friend school coffee butter mirror puzzle rocket banana flower "
        "island jungle kitten lemon mango night paper queen robot sugar train under voice water zebra "
        "quick brown lazy happy bright cold warm small large fast slow blue red pink gold moon star "
        "sun rain snow wind fire book door road ship bird fish tree leaf seed milk bread salt glass "
        "chair clock horse sheep goat owl fox bear wolf"
    ).split()
)
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_NUM_WORDS = tuple(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()
)
_UNITS = (  # (from unit, to unit, factor): integer conversions only, so answers are exact
    ("kilometers", "meters", 1000),
    ("hours", "minutes", 60),
    ("kilograms", "grams", 1000),
    ("minutes", "seconds", 60),
    ("meters", "centimeters", 100),
    ("days", "hours", 24),
    ("liters", "milliliters", 1000),
    ("feet", "inches", 12),
    ("weeks", "days", 7),
)
# Python function families: (name pattern, description, body expression); x is an int, s a str.
_PY_INT = (
    ("add_{w}", "x plus {k}", "x + {k}"),
    ("subtract_{w}", "x minus {k}", "x - {k}"),
    ("times_{w}", "x multiplied by {k}", "x * {k}"),
    ("mod_{w}", "the remainder of x divided by {k}", "x % {k}"),
    ("is_multiple_of_{w}", "True if x is divisible by {k}, else False", "x % {k} == 0"),
    ("is_greater_than_{w}", "True if x is greater than {k}, else False", "x > {k}"),
    ("cap_at_{w}", "the smaller of x and {k}", "min(x, {k})"),
    ("floor_at_{w}", "the larger of x and {k}", "max(x, {k})"),
)
_PY_STR = (
    ("count_{c}", "the number of times the letter '{c}' appears in the string s", "s.count('{c}')"),
    (
        "starts_with_{c}",
        "True if the string s starts with the letter '{c}', else False",
        "s.startswith('{c}')",
    ),
    ("ends_with_{c}", "True if the string s ends with the letter '{c}', else False", "s.endswith('{c}')"),
)
_SYNONYMS = (
    ("What is", "What's"),
    ("Compute", "Calculate"),
    ("Write", "Create"),
    ("returns", "gives back"),
    ("numbers", "values"),
    ("number", "value"),
    ("Give", "Provide"),
    ("string", "text"),
    ("list", "sequence"),
    ("sum", "total"),
    ("Convert", "Change"),
    ("following", "given"),
)


def _word(k: int) -> str:
    """A number as a Python-identifier fragment: words up to twenty ('three'), digits above."""
    return _NUM_WORDS[k] if k < len(_NUM_WORDS) else str(k)


# (instruction, input) templates, filled from the fields a generator returns. Some put the data
# in the instruction and some in the input, so the pool is not trivially uniform.
_TEMPLATES: dict[str, tuple[tuple[str, str], ...]] = {
    "add": (
        ("What is {a} + {b}?", ""),
        ("Add the two numbers. Give only the sum.", "{a} and {b}"),
        ("Compute the sum of {a} and {b}.", ""),
    ),
    "subtract": (
        ("What is {a} - {b}?", ""),
        ("Compute {a} minus {b}.", ""),
        ("Subtract the second number from the first. Give only the result.", "{a} and {b}"),
    ),
    "multiply": (
        ("What is {a} * {b}?", ""),
        ("Compute the product of {a} and {b}.", ""),
        ("Multiply the two numbers. Give only the product.", "{a} and {b}"),
    ),
    "reverse_string": (
        ('Reverse the string "{s}".', ""),
        ("Write the following string backwards.", "{s}"),
        ("Give the characters of this string in reverse order.", "{s}"),
    ),
    "uppercase": (
        ("Convert the text to uppercase.", "{s}"),
        ('Write "{s}" in capital letters.', ""),
        ("Rewrite the following string in uppercase.", "{s}"),
    ),
    "count_vowels": (
        ('How many vowels (a, e, i, o, u) are in "{s}"?', ""),
        ("Count the vowels (a, e, i, o, u) in the following text.", "{s}"),
        ('Give the number of vowels (a, e, i, o, u) in the text "{s}".', ""),
    ),
    "sort_list": (
        ("Sort the list [{xs}] in ascending order.", ""),
        ("Sort these numbers from smallest to largest.", "{xs}"),
        ("Return the following list sorted in ascending order.", "[{xs}]"),
    ),
    "list_max": (
        ("What is the largest number in [{xs}]?", ""),
        ("Find the maximum of the following numbers.", "{xs}"),
        ("Give the biggest value in this list.", "[{xs}]"),
    ),
    "unit_conversion": (
        ("How many {dst} are in {v} {src}?", ""),
        ("Convert to {dst}.", "{v} {src}"),
        ("Convert {v} {src} to {dst}. Give the number only.", ""),
    ),
    "parity": (
        ("Is {n} even or odd?", ""),
        ("State whether {n} is even or odd.", ""),
        ("Is the following number even or odd? Answer with one word.", "{n}"),
    ),
    "word_count": (
        ("How many words are in the following sentence?", "{s}"),
        ('Count the words in "{s}".', ""),
        ("Give the number of words in this text.", "{s}"),
    ),
    "python_function": (
        ("Write a Python function `{sig}` that returns {desc}.", ""),
        ("Define `{sig}` in Python. It should return {desc}.", ""),
        ("Write the Python function described below.", "`{sig}` returns {desc}."),
    ),
}

# ----------------------------------------------------------------------------- task generators
# Each returns (problem key, template fields, answer, extra meta). The problem key names the
# underlying problem independent of phrasing, so two phrasings of one problem count as the same.


def _words(r: random.Random, lo: int, hi: int) -> str:
    return " ".join(r.choice(_WORDS) for _ in range(r.randint(lo, hi)))


def _g_arith(op: str) -> Callable[[random.Random], tuple]:
    def gen(r: random.Random) -> tuple:
        if op == "*":
            a, b = r.randint(2, 20), r.randint(2, 50)  # "small numbers": products up to 1000
        else:
            a, b = r.randint(0, 999), r.randint(0, 999)
            if op == "-" and a < b:
                a, b = b, a  # keeps answers non-negative (no sign to get wrong)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return (a, b), {"a": a, "b": b}, str(value), {}

    return gen


def _g_string(
    transform: Callable[[str], str], make: Callable[[random.Random], str], extra: dict | None = None
) -> Callable[[random.Random], tuple]:
    def gen(r: random.Random) -> tuple:
        s = make(r)
        return s, {"s": s}, transform(s), dict(extra or {})

    return gen


def _g_list(reduce: Callable[[tuple], Any], hi: int, n_hi: int) -> Callable[[random.Random], tuple]:
    def gen(r: random.Random) -> tuple:
        xs = tuple(r.randint(0, hi) for _ in range(r.randint(4, n_hi)))
        return xs, {"xs": ", ".join(map(str, xs))}, str(reduce(xs)), {}

    return gen


def _g_units(r: random.Random) -> tuple:
    src, dst, f = r.choice(_UNITS)
    v = r.randint(2, 99)  # >= 2 so the plural unit names read correctly
    return (src, v), {"src": src, "dst": dst, "v": v}, str(v * f), {}


def _g_parity(r: random.Random) -> tuple:
    n = r.randint(0, 9999)
    return n, {"n": n}, "even" if n % 2 == 0 else "odd", {}


def _g_python(r: random.Random) -> tuple:
    key: tuple[str, int | str]  # the problem's identity: its family and the family's parameter
    if r.random() < 0.75:  # integer families: 8 x 98 distinct problems
        pat, desc, body = r.choice(_PY_INT)
        k = r.randint(2, 99)
        name, arg, key = pat.format(w=_word(k)), "x", (pat, k)
        desc, body = desc.format(k=k), body.format(k=k)
        probes: list = sorted({0, 1, k - 1, k, k + 1, 2 * k + 1, r.randint(-20, 3 * k)})
    else:  # string families: 3 x 26
        pat, desc, body = r.choice(_PY_STR)
        c = r.choice(_LETTERS)
        name, arg, key = pat.format(c=c), "s", (pat, c)
        desc, body = desc.format(c=c), body.format(c=c)
        w1, w2 = r.choice(_WORDS), r.choice(_WORDS)
        probes = ["", c, f"{c}{w1}", f"{w2}{c}{c}", w1, f"{w2} {c}x{c}"]
    code = f"def {name}({arg}):\n    return {body}\n"
    env: dict[str, Any] = {}
    exec(code, env)  # our own reference code: the expected values come from what we ship
    tests = [f"assert {name}({p!r}) == {env[name](p)!r}" for p in probes]
    return key, {"sig": f"{name}({arg})", "desc": desc}, code, {"entry_point": name, "tests": tests}


_GENERATORS: dict[str, Callable[[random.Random], tuple]] = {
    "add": _g_arith("+"),
    "subtract": _g_arith("-"),
    "multiply": _g_arith("*"),
    "reverse_string": _g_string(
        lambda s: s[::-1], lambda r: "".join(r.choice(_LETTERS) for _ in range(r.randint(4, 8)))
    ),  # random letters: a large space
    "uppercase": _g_string(
        str.upper, lambda r: _words(r, 2, 3), {"case_sensitive": True}
    ),  # case IS the answer here
    "count_vowels": _g_string(lambda s: str(sum(ch in "aeiou" for ch in s)), lambda r: _words(r, 1, 2)),
    "sort_list": _g_list(sorted, 99, 7),
    "list_max": _g_list(max, 999, 8),
    "unit_conversion": _g_units,
    "parity": _g_parity,
    "word_count": _g_string(lambda s: str(len(s.split())), lambda r: _words(r, 3, 10)),
    "python_function": _g_python,
}
assert tuple(_GENERATORS) == CATEGORIES and tuple(_TEMPLATES) == CATEGORIES


def _text_key(instruction: str, inp: str) -> str:
    """Instruction+input up to case, whitespace and trailing punctuation (for collision checks)."""
    return " ".join(f"{instruction}\n{inp}".lower().split()).rstrip(".?!")


def _new_row(r: random.Random, cat: str, used_problems: set, used_texts: set) -> dict:
    """A fresh row of `cat` whose problem and text are not in the `used_*` sets (which it joins)."""
    for _ in range(_MAX_TRIES):
        key, fields, answer, extra = _GENERATORS[cat](r)
        instr, inp = (t.format(**fields) for t in r.choice(_TEMPLATES[cat]))
        tkey = _text_key(instr, inp)
        if (cat, key) in used_problems or tkey in used_texts:
            continue  # rejection sampling: regenerate until unseen
        used_problems.add((cat, key))
        used_texts.add(tkey)
        meta = {"check": "python" if cat == "python_function" else "exact", "answer": answer}
        if cat != "python_function":
            meta["case_sensitive"] = bool(extra.get("case_sensitive", False))
        else:
            meta.update(extra)
        return {"id": "", "category": cat, "instruction": instr, "input": inp, "output": answer, "meta": meta}
    raise UserValueError(
        f"could not generate {_MAX_TRIES} distinct '{cat}' problems; "
        f"the pool is too large for this category's problem space, lower n_train"
    )


def _perturb(r: random.Random, text: str) -> str:
    """One surface edit: extra whitespace, a case change, trailing punctuation, or a synonym."""
    kind = r.randrange(4)
    if kind == 0:
        spaces = [m.start() for m in re.finditer(" ", text)] or [len(text)]
        p = r.choice(spaces)
        return text[:p] + " " + text[p:]
    if kind == 1:
        return text[0].swapcase() + text[1:] if r.random() < 0.5 else text.lower()
    if kind == 2:
        if text[-1] in ".?!":
            other = r.choice("!?.".replace(text[-1], ""))
            return text[:-1] if r.random() < 0.5 else text[:-1] + other
        return text + "."
    options = [(a, b) for a, b in _SYNONYMS if re.search(rf"\b{re.escape(a)}\b", text)]
    if not options:
        return text + " "  # no synonym applies: fall back to trailing whitespace
    a, b = r.choice(options)
    return re.sub(rf"\b{re.escape(a)}\b", b, text, count=1)


def _near_copy(r: random.Random, row: dict, used_texts: set) -> dict:
    """A near-duplicate of `row`: 1-2 perturbations of the instruction, still difflib-similar."""
    for _ in range(_MAX_TRIES):
        text = row["instruction"]
        for _ in range(r.randint(1, 2)):
            text = _perturb(r, text)
        # Keep only genuinely similar, genuinely different text (not an exact duplicate).
        if (
            text != row["instruction"]
            and difflib.SequenceMatcher(None, text, row["instruction"]).ratio() >= 0.85
        ):
            break
    else:
        text = row["instruction"] + "  "
    used_texts.add(_text_key(text, row["input"]))
    out = copy.deepcopy(row)
    out["instruction"] = text
    return out


def _allocate(total: int, weights: list[float], floor: int = 1) -> list[int]:
    """Split `total` into one count per weight, each >= `floor`, by largest remainder
    (deterministic: ties go to the earlier weight)."""
    rest = total - floor * len(weights)
    raw = [rest * w / sum(weights) for w in weights]
    counts = [floor + math.floor(x) for x in raw]
    order = sorted(range(len(weights)), key=lambda i: (-(raw[i] - math.floor(raw[i])), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def category_shares(
    n_categories: int = len(CATEGORIES),
    min_share: float = DEFAULT_MIN_SHARE,
    max_share: float = DEFAULT_MAX_SHARE,
) -> list[float]:
    """Shares of the training pool per category rank, commonest first: exactly `max_share` for
    rank 1, exactly `min_share` for the last rank, and between them min + (max - min) * t**p with
    t falling evenly from 1 to 0 over the ranks, p chosen (by bisection) so the shares sum to 1.
    With 12 categories, 5% and 30% (p ~ 9.7): 30%, 15%, 8.6%, 6.1%, then eight near 5%.

    ValueError (naming both shares) unless 0 < min_share <= max_share < 1 and the shares can
    sum to 1: (n - 1) * min + max <= 1 <= min + (n - 1) * max."""
    k = n_categories
    where = f"demo pool shares (min {min_share:g}, max {max_share:g}, {k} categories)"
    if k < 2:
        raise UserValueError(f"{where}: needs at least 2 categories")
    if not (0 < min_share <= max_share < 1):
        raise UserValueError(f"{where}: expected 0 < min share <= max share < 1")
    low, high = (k - 1) * min_share + max_share, min_share + (k - 1) * max_share
    if not (low <= 1 + 1e-12 and high >= 1 - 1e-12):
        raise UserValueError(
            f"{where}: the shares cannot sum to 1 (with the rarest at the min and the commonest at "
            f"the max they sum to between {low:.4g} and {high:.4g}); lower the min share or raise "
            "the max share"
        )
    if max_share - min_share < 1e-12:
        return [1.0 / k] * k  # min == max == 1/k: a uniform mix
    # The k - 2 middle ranks must add `target` (in units of max - min) above the min share.
    target = (1 - k * min_share) / (max_share - min_share) - 1
    ts = [1 - i / (k - 1) for i in range(1, k - 1)]
    if target <= 1e-12:
        middle = [0.0] * len(ts)
    elif target >= len(ts) - 1e-12:
        middle = [1.0] * len(ts)
    else:  # sum(t**p) falls from k - 2 (p -> 0) to 0 (p -> inf): bisect on log p
        lo, hi = -30.0, 30.0
        for _ in range(200):
            mid = (lo + hi) / 2
            if sum(t ** math.exp(mid) for t in ts) > target:
                lo = mid
            else:
                hi = mid
        p = math.exp((lo + hi) / 2)
        middle = [t**p for t in ts]
    return [max_share] + [min_share + (max_share - min_share) * m for m in middle] + [min_share]


def _copy_quotas(n_copies: int, shares: list[float], counts: list[int]) -> list[int]:
    """Planted copies per category: `n_copies` split by share (largest remainder), each category
    keeping at least one original (a copy needs an original of its own category)."""
    quota = _allocate(n_copies, shares, floor=0)
    cap = [c - 1 for c in counts]
    spill = sum(max(0, q - m) for q, m in zip(quota, cap))
    quota = [min(q, m) for q, m in zip(quota, cap)]
    for i in sorted(range(len(quota)), key=lambda i: (-(cap[i] - quota[i]), i)):
        if spill == 0:
            break
        extra = min(spill, cap[i] - quota[i])
        quota[i] += extra
        spill -= extra
    return quota


def generate_demo_pool(
    seed: int = 0,
    n_train: int = 480,
    n_heldout_per_category: int = 8,
    min_share: float = DEFAULT_MIN_SHARE,
    max_share: float = DEFAULT_MAX_SHARE,
) -> tuple[list[dict], list[dict]]:
    """Returns (train_rows, heldout_rows), deterministic in the arguments.

    Each row: {"id": "demo-train-00000" | "demo-heldout-00000", "category", "instruction",
    "input" (may be ""), "output" (a correct response), "meta": {"check": "exact" | "python",
    "answer", ["case_sensitive"], ["entry_point", "tests"], ["near_duplicate_of" |
    "exact_duplicate_of"]}}. len(train_rows) == n_train exactly, planted copies included
    (~5% near, ~1% exact; a copy always comes after its original, and is of its category).
    Category shares of the training rows, copies included: `category_shares(12, min_share,
    max_share)` rounded to whole rows (largest remainder; every category at least one row); the
    seed decides which category gets which rank. Held-out rows number n_heldout_per_category per
    category and share no problem or instruction+input with training.
    """
    if n_train < 2 * len(CATEGORIES):
        raise UserValueError(f"n_train must be >= {2 * len(CATEGORIES)} (2 per category), got {n_train}")
    if n_heldout_per_category < 1:
        raise UserValueError(f"n_heldout_per_category must be >= 1, got {n_heldout_per_category}")
    shares = category_shares(len(CATEGORIES), min_share, max_share)
    r = random.Random(seed)
    n_near = max(1, round(_NEAR_DUP_FRACTION * n_train))
    n_exact = max(1, round(_EXACT_DUP_FRACTION * n_train))
    n_base = n_train - n_near - n_exact

    ranked = list(CATEGORIES)
    r.shuffle(ranked)  # which category is common is fixed by the seed
    # Rows per category, planted copies included: the shares rounded to whole rows (a pool too
    # small to give the rarest category a row by rounding gives every category one first).
    totals = _allocate(n_train, shares, floor=0)
    if min(totals) < 1:
        totals = _allocate(n_train, shares)
    copies = _copy_quotas(n_near + n_exact, shares, totals)
    cats = [c for c, t, q in zip(ranked, totals, copies) for _ in range(t - q)]
    assert len(cats) == n_base
    r.shuffle(cats)

    used_problems: set = set()
    used_texts: set = set()
    rows = [_new_row(r, c, used_problems, used_texts) for c in cats]

    originals = []  # each category's copies come from originals of that category
    for c, q in zip(ranked, copies):
        originals += r.sample([i for i, cat in enumerate(cats) if cat == c], q)
    r.shuffle(originals)  # which copies are near and which exact
    pairs = []  # (original index, copy index, meta key)
    for j, oi in enumerate(originals):
        if j < n_near:
            rows.append(_near_copy(r, rows[oi], used_texts))
            pairs.append((oi, len(rows) - 1, "near_duplicate_of"))
        else:
            rows.append(copy.deepcopy(rows[oi]))
            pairs.append((oi, len(rows) - 1, "exact_duplicate_of"))

    perm = list(range(len(rows)))
    r.shuffle(perm)
    pos = {old: new for new, old in enumerate(perm)}
    for oi, ci, _ in pairs:  # copy after original, so "keep the first" dedup drops the copy
        if pos[ci] < pos[oi]:
            pos[ci], pos[oi] = pos[oi], pos[ci]
    train: list[dict] = [{}] * len(rows)
    for old, new in pos.items():
        rows[old]["id"] = f"demo-train-{new:05d}"
        train[new] = rows[old]
    for oi, ci, field in pairs:
        rows[ci]["meta"][field] = rows[oi]["id"]

    heldout: list[dict[str, Any]] = []
    for cat in CATEGORIES:  # shares used_* with training: no held-out problem was trained on
        for _ in range(n_heldout_per_category):
            row = _new_row(r, cat, used_problems, used_texts)
            row["id"] = f"demo-heldout-{len(heldout):05d}"
            heldout.append(row)
    return train, heldout


def category_counts(rows: list[dict]) -> dict[str, int]:
    """Rows per category, in CATEGORIES order (planted copies included)."""
    return {c: sum(row["category"] == c for row in rows) for c in CATEGORIES}


if __name__ == "__main__":
    import json

    tr, ho = generate_demo_pool()
    print(json.dumps({"train": category_counts(tr), "heldout": category_counts(ho)}, indent=2))
