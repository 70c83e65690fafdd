"""`dedup-exact`: drop exact duplicates after text normalization, keep the first of each.

Two examples are duplicates when their normalized prompt and response are equal: Unicode NFKC,
case-folded, runs of whitespace collapsed to one space, trimmed (so "Add 2 and 3." and
"add  2 and 3. " are one example). The first occurrence in pool order is kept. With a budget, the
unique examples are sampled down at random to it (or topped up with duplicates if too few; the
selection summary says how many were duplicates and what was done).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

import numpy as np

from baselines.common import check_budget, fill_to_budget
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection

_WS = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """NFKC, case-folded, whitespace runs -> one space, trimmed."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def text_key(prompt: str, response: str, fields: str = "both") -> str:
    """SHA-256 of the normalized prompt and/or response (a 0x1f separator keeps fields apart)."""
    parts = {"both": (prompt, response), "prompt": (prompt,), "response": (response,)}[fields]
    blob = "\x1f".join(normalize_text(p) for p in parts)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@register_selector("dedup-exact")
class DedupExactSelector(Parameterized):
    """Exact duplicates (normalized prompt + response hash) removed; budget met at random.

    fields: what must match: both (default), prompt, or response.
    """

    # match_compute_of's planned own selection cost, in forward passes over the pool
    # (repro/experiments/compute.py): no model: text hashing on the CPU.
    planned_selection_passes = 0.0

    @dataclass
    class Params:
        fields: Literal["both", "prompt", "response"] = param("both", help="which text must match exactly")

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        budget = check_budget("dedup-exact", pool, budget, optional=True)
        seen: set[str] = set()
        kept = []
        for i, e in enumerate(pool.examples):
            key = text_key(e.prompt, e.response, self.fields)
            if key not in seen:
                seen.add(key)
                kept.append(i)
        return fill_to_budget(
            "dedup-exact", pool, np.array(kept, dtype=np.int64), budget, ctx.seed, {"fields": self.fields}
        )
