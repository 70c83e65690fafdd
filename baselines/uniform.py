"""`uniform`: the paper's Uniform baseline (method.md step 9), by name.

CluSTER's features and clusters (K = world size, soft cap), but instead of pruning every cluster
is up-sampled WITH replacement to the largest cluster's size, with unit weights. It is
`cluster` with `variant: uniform`; this file only gives it its own registry name so that grids
and result tables call it what the paper calls it. Its parameters, and their defaults, are
ClusterSelector's that concern features and clusters (read from its signature, not repeated).
"""

from __future__ import annotations

import inspect
from typing import Any

from method.selector import ClusterSelector
from repro.core.config import ExperimentConfig
from repro.core.interfaces import SelectionContext
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
_CLUSTER_SIG = inspect.signature(ClusterSelector)


@register_selector("uniform")
class UniformSelector:
    """The paper's Uniform: CluSTER's clusters, each up-sampled with replacement to the largest."""

    takes_budget = False  # its kept count comes from the clusters (repro/contracts.py)

    # What the registry shows and checks config params against: the shared ones, with
    # ClusterSelector's defaults.
    __signature__ = inspect.Signature([_CLUSTER_SIG.parameters[p] for p in SHARED_PARAMS])

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(SHARED_PARAMS))
        if unknown:
            raise TypeError(
                f"selection.params.{unknown[0]}: selector 'uniform' takes no parameter "
                f"{unknown[0]!r} (it takes: {', '.join(SHARED_PARAMS)})"
            )
        self.inner = ClusterSelector(variant="uniform", **params)

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
