"""The generated demo pool as a data source: `data.sources: [{path: demo, params: {...}}]`.

It is registered as any installed package's data source is: this package's pyproject.toml
advertises `DemoSource` in the entry-point group `cluster_repro.data_sources` under the name
`demo`, and the registry (repro/core/registry.py, repro/core/sources.py) finds it there. Its
generator's settings are its own typed `Params` (`cluster-repro ls sources`); what the stages
need to know of it, it declares: its rows are code tasks (`domain`), drawn from the run's seed
(`seeded`), with held-out rows of its own (`own_heldout`) that the `demo` benchmark scores
(`benchmark`, repro/demo/tasks.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from repro.core.config.builder import ConfigError
from repro.core.params import Parameterized, param
from repro.core.prompts import PromptFormat, Rendered, RowError, render_alpaca, text_field
from repro.core.sources import SourceRows
from repro.demo.pool import (
    CATEGORIES,
    DEFAULT_MAX_SHARE,
    DEFAULT_MIN_SHARE,
    category_shares,
    generate_demo_pool,
)

# The demo pool's own compact template: the Alpaca preamble would triple the tokens of these
# short tasks (and the CPU demo's training time) without teaching anything.
DEMO_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
DEMO_PROMPT_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"


def render_demo(row: Mapping[str, Any]) -> Rendered:
    """Demo rows: the compact demo template, with the category and meta (answer keys) kept."""
    r = render_alpaca(row)
    inp = text_field(row, "input", required=False)
    instruction = text_field(row, "instruction")
    prompt = (
        DEMO_PROMPT_INPUT.format(instruction=instruction, input=inp)
        if inp.strip()
        else DEMO_PROMPT.format(instruction=instruction)
    )
    category = text_field(row, "category")
    meta = row.get("meta") or {}
    if not isinstance(meta, dict):
        raise RowError(
            "not_mapping:meta", "meta", f"field 'meta': expected a mapping, got {type(meta).__name__}"
        )
    return Rendered(prompt, r.response, category, dict(meta), user=r.user)


FORMAT = PromptFormat(
    "demo",
    (("category", "instruction", "output"),),
    render_demo,
    ("input", "meta"),
    "the generated demo pool's compact template (### Instruction / ### Response)",
)


class DemoSource(Parameterized):
    """The generated demo pool: twelve kinds of short, checkable tasks, the category mix skewed
    on purpose, with planted near and exact duplicates (repro/demo/pool.py)."""

    params_key = "data.sources[].params"

    @dataclass
    class Params:
        train_size: int = param(
            480,
            lo=2 * len(CATEGORIES),
            note=f"2 per category: the generated pool has {len(CATEGORIES)}",
            help="training rows, planted copies included",
        )
        heldout_per_category: int = param(
            8, lo=1, help="held-out rows of every category, however rare it is in training"
        )
        min_share: float = param(
            DEFAULT_MIN_SHARE,
            lo=0,
            hi=1,
            lo_incl=False,
            hi_incl=False,
            note="a fraction of the training rows",
            help="the rarest category's share of the training rows",
        )
        max_share: float = param(
            DEFAULT_MAX_SHARE,
            lo=0,
            hi=1,
            lo_incl=False,
            hi_incl=False,
            note="a fraction of the training rows",
            help="the commonest category's share (the ranks between fall off steeply; the seed "
            "decides which category is which rank)",
        )

        def check(self) -> None:
            try:
                category_shares(len(CATEGORIES), self.min_share, self.max_share)
            except ValueError as e:
                raise ConfigError(f"min_share: with max_share: {e}") from None

    format = FORMAT
    domain = "code"  # small programs and string, list and arithmetic exercises; nothing medical
    seeded = True
    own_heldout = True
    benchmark = "demo"

    def rows(self, seed: int) -> SourceRows:
        train, heldout = generate_demo_pool(
            seed, self.train_size, self.heldout_per_category, self.min_share, self.max_share
        )
        return SourceRows(train, heldout)

    def size(self) -> int:
        return int(self.train_size)
