"""`full`: keep the whole pool (the full-data reference every method is compared with)."""

from __future__ import annotations

from dataclasses import dataclass

from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.params import Parameterized
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


@register_selector("full")
class FullSelector(Parameterized):
    """Keeps every example, in pool order. A budget other than the pool size is an error."""

    takes_budget = False  # it keeps the pool (repro/contracts.py: cannot be matched to a kept count)

    @dataclass
    class Params:
        """No parameters."""

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        if budget is not None and budget != len(pool):
            raise SelectionError(
                f"selector 'full' keeps all {len(pool)} examples; got a budget of "
                f"{budget} (remove selection.fraction / selection.n)"
            )
        return Selection(ids=list(pool.ids), info={"method": "full"})
