"""`uniform`: the paper's Uniform baseline (method.md step 9), by name.

CluSTER's features and clusters (K = world size, soft cap), but instead of pruning every cluster
is up-sampled WITH replacement to the largest cluster's size, with unit weights. It is
`cluster` with `variant: uniform`; this file only gives it its own registry name so that grids
and result tables call it what the paper calls it. Its parameters, and their defaults, are
ClusterSelector's that concern features and clusters (read from its signature, not repeated).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from method.selector import ClusterParams, ClusterSelector
from repro.core.config.schema import ExperimentConfig
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection

# ClusterSelector's parameters that apply to the Uniform variant (the rest choose what to prune).
SHARED_PARAMS = (
    "feature_type",
    "normalization",
    "cap",
    "kmeans",
    "n_init",
    "max_iter",
    "feature_batch_size",
    "proj_dim",
    "feature_workers",
)

# Uniform's Params: those fields of ClusterParams, with their types, defaults, ranges and help.
_HINTS = typing.get_type_hints(ClusterParams)
UniformParams = dataclasses.make_dataclass(
    "UniformParams",
    [
        (f.name, _HINTS[f.name], dataclasses.field(default=f.default, metadata=f.metadata))
        for f in dataclasses.fields(ClusterParams)
        if f.name in SHARED_PARAMS
    ],
)
UniformParams.__module__ = __name__


@register_selector("uniform")
class UniformSelector(Parameterized):
    """The paper's Uniform: CluSTER's clusters, each up-sampled with replacement to the largest."""

    takes_budget = False  # its kept count comes from the clusters (repro/contracts.py)

    Params = UniformParams

    def setup(self) -> None:
        shared = {name: getattr(self.params, name) for name in SHARED_PARAMS}
        self.inner = ClusterSelector(variant="uniform", **shared)

    @staticmethod
    def planned_kept_fraction(params: dict[str, Any], estimate: dict[str, Any]) -> tuple[float, str]:
        """The dry run's assumption: CluSTER's for its Uniform variant."""
        return ClusterSelector.planned_kept_fraction({**params, "variant": "uniform"}, estimate)

    def feature_key(self, cfg: ExperimentConfig) -> dict[str, Any] | None:
        """CluSTER's (the same features, so a `uniform` cell shares them with `cluster` cells)."""
        return self.inner.feature_key(cfg)

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        sel = self.inner.select(pool, budget, ctx)
        sel.info["method"] = "uniform"
        return sel
