"""`dedup-minhash`: near-duplicate removal by MinHash LSH over word shingles (datasketch).

Each example's normalized text (prompt + response, as `dedup-exact` normalizes it) becomes a set
of word n-grams (`shingle_size` words; a text shorter than that is one shingle). Examples are
visited in pool order: one whose MinHash estimate of Jaccard similarity to an already kept
example is >= `threshold` is a near-duplicate and dropped (LSH finds the candidates; the estimate
is checked, so LSH's false positives do not drop anything). The first of each group is kept. A
budget is then met at random, as in `dedup-exact`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from baselines.common import check_budget, fill_to_budget
from baselines.dedup_exact import normalize_text
from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


def shingles(text: str, size: int) -> set[str]:
    """Word `size`-grams of the normalized text (the whole text as one shingle if shorter)."""
    words = normalize_text(text).split(" ")
    if len(words) <= size:
        return {" ".join(words)}
    return {" ".join(words[i : i + size]) for i in range(len(words) - size + 1)}


@register_selector("dedup-minhash")
class DedupMinHashSelector(Parameterized):
    """Near-duplicates (MinHash Jaccard >= threshold over word shingles) removed; budget at random.

    threshold: Jaccard similarity in (0, 1] above which two examples are near-duplicates (0.8).
    shingle_size: words per shingle (3). num_perm: MinHash permutations (128; more = a finer
    estimate). minhash_seed: the permutations' seed (fixed, so a pool always dedups the same way).
    """

    # match_compute_of's planned own selection cost, in forward passes over the pool
    # (repro/experiments/compute.py): no model: MinHash on the CPU.
    planned_selection_passes = 0.0

    @dataclass
    class Params:
        threshold: float = param(
            0.8,
            lo=0,
            hi=1,
            lo_incl=False,
            note="a Jaccard similarity",
            help="similarity that makes a duplicate",
        )
        shingle_size: int = param(3, lo=1, help="words per shingle")
        num_perm: int = param(128, lo=16, help="MinHash permutations")
        minhash_seed: int = param(1, lo=0, hi=2**32 - 1, help="the MinHash seed")

    def minhashes(self, pool: Pool) -> list:
        from datasketch import MinHash

        out = []
        for e in pool.examples:
            m = MinHash(num_perm=self.num_perm, seed=self.minhash_seed)
            m.update_batch(
                [s.encode("utf-8") for s in sorted(shingles(e.prompt + "\n" + e.response, self.shingle_size))]
            )
            out.append(m)
        return out

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        from datasketch import MinHashLSH

        budget = check_budget("dedup-minhash", pool, budget, optional=True)
        hashes = self.minhashes(pool)
        try:
            lsh = MinHashLSH(threshold=self.threshold, num_perm=self.num_perm)
        except ValueError as e:  # datasketch finds no band layout for this threshold
            raise SelectionError(
                f"selection.params.threshold = {self.threshold} with num_perm = "
                f"{self.num_perm}: no LSH band layout fits ({e}); lower the "
                "threshold (at most about 0.95) or raise num_perm"
            ) from e
        kept: list[int] = []
        for i, m in enumerate(hashes):
            near = [int(c) for c in lsh.query(m)]
            if any(m.jaccard(hashes[c]) >= self.threshold for c in near):
                continue
            lsh.insert(str(i), m)
            kept.append(i)
        return fill_to_budget(
            "dedup-minhash",
            pool,
            np.array(kept, dtype=np.int64),
            budget,
            ctx.seed,
            {"threshold": self.threshold, "shingle_size": self.shingle_size, "num_perm": self.num_perm},
        )
