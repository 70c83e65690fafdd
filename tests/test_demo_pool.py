"""Tests for the generated demo pool (repro/demo/pool.py): sizes, skew, planted duplicates,
held-out separation, determinism, and the scorer (right answers 1.0, wrong ones 0.0)."""

from __future__ import annotations

import difflib
import json
import time
from collections import Counter

import pytest

from repro.demo.pool import CATEGORIES, category_counts, category_shares, generate_demo_pool
from repro.demo.score import score_generation


@pytest.fixture(scope="module")
def pool():
    return generate_demo_pool(seed=0, n_train=480, n_heldout_per_category=8)


def _by_cat(rows, cat):
    return [r for r in rows if r["category"] == cat]


def test_deterministic_and_seed_dependent(pool):
    again = generate_demo_pool(seed=0, n_train=480, n_heldout_per_category=8)
    assert json.dumps(again, sort_keys=True) == json.dumps(pool, sort_keys=True)
    other = generate_demo_pool(seed=1, n_train=480, n_heldout_per_category=8)
    assert json.dumps(other, sort_keys=True) != json.dumps(pool, sort_keys=True)


@pytest.mark.parametrize("n_train,n_held", [(480, 8), (24, 1), (137, 3)])
def test_exact_sizes_unique_ids_and_all_categories(n_train, n_held):
    train, held = generate_demo_pool(seed=3, n_train=n_train, n_heldout_per_category=n_held)
    assert len(train) == n_train
    assert len(held) == n_held * len(CATEGORIES)
    ids = [r["id"] for r in train + held]
    assert len(set(ids)) == len(ids)
    assert all(r["id"].startswith("demo-train-") for r in train)
    assert all(r["id"].startswith("demo-heldout-") for r in held)
    assert set(category_counts(train)) == set(CATEGORIES)
    assert min(category_counts(train).values()) >= 1
    assert set(category_counts(held).values()) == {n_held}
    for r in train + held:
        assert r["meta"]["check"] in ("exact", "python")
        assert isinstance(r["input"], str) and r["instruction"] and r["output"]


def test_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_train"):
        generate_demo_pool(n_train=2 * len(CATEGORIES) - 1)
    with pytest.raises(ValueError, match="n_heldout_per_category"):
        generate_demo_pool(n_heldout_per_category=0)


def test_category_mix_is_skewed(pool):
    counts = category_counts(pool[0])
    assert sum(counts.values()) == 480
    assert max(counts.values()) >= 3 * min(counts.values())


@pytest.mark.parametrize("n_train,seed", [(480, 0), (320, 1), (320, 42), (96, 2), (137, 5)])
def test_every_category_between_five_and_thirty_percent(n_train, seed):
    """The default skew: every category is 5%..30% of the training pool (planted copies
    included, up to one row of rounding), the rarest and commonest at the ends; held-out rows
    stay the same number per category however rare the category is in training."""
    train, held = generate_demo_pool(seed=seed, n_train=n_train, n_heldout_per_category=3)
    shares = sorted(n / n_train for n in category_counts(train).values())
    tol = 1 / n_train
    assert all(0.05 - tol <= s <= 0.30 + tol for s in shares), shares
    assert shares[0] <= 0.05 + tol and shares[-1] >= 0.30 - tol
    assert set(category_counts(held).values()) == {3}


def test_category_shares_span_min_to_max_and_sum_to_one():
    shares = category_shares(12, 0.05, 0.30)
    assert shares[0] == 0.30 and shares[-1] == 0.05
    assert sum(shares) == pytest.approx(1.0, abs=1e-9)
    assert all(a >= b for a, b in zip(shares, shares[1:]))  # commonest first
    other = category_shares(12, 0.02, 0.40)
    assert other[0] == 0.40 and other[-1] == 0.02 and sum(other) == pytest.approx(1.0, abs=1e-9)
    assert category_shares(4, 0.25, 0.25) == [0.25] * 4  # min == max == 1/n: uniform
    for lo, hi in [(0.2, 0.3), (0.01, 0.05), (0.3, 0.2), (0.0, 0.3)]:
        with pytest.raises(ValueError, match=f"min {lo:g}, max {hi:g}"):
            category_shares(12, lo, hi)


def test_other_shares_change_the_mix_and_copies_stay_in_their_category():
    train, _ = generate_demo_pool(
        seed=0, n_train=400, n_heldout_per_category=1, min_share=0.02, max_share=0.4
    )
    counts = sorted(category_counts(train).values())
    assert counts[0] == round(0.02 * 400) and counts[-1] == round(0.4 * 400)
    by_id = {r["id"]: r for r in train}
    for r in train:
        orig = r["meta"].get("near_duplicate_of") or r["meta"].get("exact_duplicate_of")
        if orig:
            assert by_id[orig]["category"] == r["category"]


def test_phrasings_vary(pool):
    train, _ = pool
    for cat in CATEGORIES:
        # Templates differ in wording; the first three words tell most of them apart.
        starts = {" ".join(r["instruction"].split()[:3]).lower() for r in _by_cat(train, cat)}
        assert len(starts) >= 2, cat


def test_planted_near_and_exact_duplicates(pool):
    train, _ = pool
    by_id = {r["id"]: r for r in train}
    near = [r for r in train if "near_duplicate_of" in r["meta"]]
    exact = [r for r in train if "exact_duplicate_of" in r["meta"]]
    assert 0.03 * len(train) <= len(near) <= 0.07 * len(train)
    assert 1 <= len(exact) <= 0.02 * len(train)
    for r in near:
        orig = by_id[r["meta"]["near_duplicate_of"]]
        assert orig["id"] != r["id"] and orig["category"] == r["category"]
        assert r["instruction"] != orig["instruction"]
        assert r["input"] == orig["input"] and r["output"] == orig["output"]
        ratio = difflib.SequenceMatcher(None, r["instruction"], orig["instruction"]).ratio()
        assert ratio > 0.8, (r["instruction"], orig["instruction"])
    for r in exact:
        orig = by_id[r["meta"]["exact_duplicate_of"]]
        assert orig["id"] != r["id"]
        assert (r["instruction"], r["input"], r["output"]) == (
            orig["instruction"],
            orig["input"],
            orig["output"],
        )
    # Nothing else is an exact duplicate: only the planted copies repeat instruction+input.
    keys = Counter((r["instruction"], r["input"]) for r in train)
    assert sum(n - 1 for n in keys.values()) == len(exact)


def test_heldout_disjoint_from_train(pool):
    train, held = pool
    train_keys = {(r["instruction"], r["input"]) for r in train}
    norm = {" ".join((r["instruction"] + " " + r["input"]).lower().split()) for r in train}
    for r in held:
        assert (r["instruction"], r["input"]) not in train_keys
        assert " ".join((r["instruction"] + " " + r["input"]).lower().split()) not in norm
    assert len({(r["instruction"], r["input"]) for r in held}) == len(held)


def test_every_row_output_scores_one(pool):
    train, held = pool
    failed = [r["id"] for r in train + held if score_generation(r["meta"], r["output"]) != 1.0]
    assert failed == []


def test_exact_scoring_normalizes_and_uses_first_line(pool):
    train, _ = pool
    row = _by_cat(train, "add")[0]
    ans = row["meta"]["answer"]
    assert score_generation(row["meta"], f"  {ans}.  \nBecause I added them.") == 1.0
    assert score_generation(row["meta"], f"Let me think.\n{ans}") == 0.0
    assert score_generation(row["meta"], str(int(ans) + 1)) == 0.0
    assert score_generation(row["meta"], "") == 0.0
    srt = _by_cat(train, "sort_list")[0]
    assert score_generation(srt["meta"], srt["output"].replace(" ", "")) == 1.0
    assert score_generation(srt["meta"], srt["output"][::-1]) == 0.0
    par = _by_cat(train, "parity")[0]
    flipped = "odd" if par["meta"]["answer"] == "even" else "even"
    assert score_generation(par["meta"], par["output"].upper()) == 1.0
    assert score_generation(par["meta"], flipped) == 0.0
    up = _by_cat(train, "uppercase")[0]
    assert score_generation(up["meta"], up["output"].lower()) == 0.0  # case is the task here


def _py_row(pool):
    return _by_cat(pool[0], "python_function")[0]


def test_python_scoring_accepts_fenced_code_with_prose(pool):
    row = _py_row(pool)
    gen = f"Sure! Here it is:\n```python\n{row['output']}```\nThis works because..."
    assert score_generation(row["meta"], gen) == 1.0
    gen = f"{row['output']}\nprint({row['meta']['entry_point']}(3))\nThat is all."
    assert score_generation(row["meta"], gen) == 1.0


def test_python_scoring_rejects_wrong_code(pool):
    row = _py_row(pool)
    name = row["meta"]["entry_point"]
    arg = "s" if "(s)" in row["output"] else "x"
    wrong = f"def {name}({arg}):\n    return [{arg}]\n"  # a list never equals an int/bool
    raises = f"def {name}({arg}):\n    raise RuntimeError('no')\n"
    assert score_generation(row["meta"], wrong) == 0.0
    assert score_generation(row["meta"], raises) == 0.0
    assert score_generation(row["meta"], "") == 0.0
    assert score_generation(row["meta"], "I cannot write that function.") == 0.0
    assert score_generation(row["meta"], f"def {name}({arg}) return 1") == 0.0  # syntax error


def test_python_scoring_times_out_infinite_loop(pool):
    row = _py_row(pool)
    name = row["meta"]["entry_point"]
    loop = f"def {name}(x):\n    while True:\n        pass\n"
    t0 = time.monotonic()
    assert score_generation(row["meta"], loop, timeout_s=1.0) == 0.0
    assert time.monotonic() - t0 < 5.0


def test_python_scoring_limits_memory(pool):
    row = _py_row(pool)
    name = row["meta"]["entry_point"]
    hog = f"def {name}(x):\n    b = bytearray(4 * 1024 ** 3)\n    return len(b)\n"
    assert score_generation(row["meta"], hog, timeout_s=5.0) == 0.0
