"""`longest-response`: keep the `budget` examples with the longest responses.

A complete outside selector: a class with `select(pool, budget, ctx) -> Selection`, its
parameters a `Params` dataclass built from the config's `selection.params` (here `unit`; a wrong
value is refused before any stage runs, naming the key), errors as `ValueError` subclasses with a
message that says what to change. It imports only cluster-repro's public types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.params import Parameterized, param
from repro.core.types import Pool, Selection


class LongestResponse(Parameterized):
    """Keep the `budget` examples with the longest responses (unit: chars or words)."""

    # Its own selection cost in forward passes over the pool: none (it runs no model), so a
    # random run at its compute can be worked out (match_compute_of; a track's baseline).
    planned_selection_passes = 0

    @dataclass
    class Params:
        unit: Literal["chars", "words"] = param("chars", help="how a response's length is counted")

    def length(self, text: str) -> int:
        return len(text) if self.unit == "chars" else len(text.split())

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        if budget is None or budget > len(pool):
            raise SelectionError(
                f"longest-response needs a budget of at most {len(pool)} "
                "examples: set selection.n or selection.fraction"
            )
        lengths = [self.length(e.response) for e in pool.examples]
        # longest first; ties by pool position, so the selection is deterministic
        order = sorted(range(len(pool)), key=lambda i: (-lengths[i], i))[:budget]
        keep = sorted(order)
        return Selection(
            ids=[pool.ids[i] for i in keep],
            scores=[float(lengths[i]) for i in keep],
            info={"method": "longest-response", "unit": self.unit},
        )
