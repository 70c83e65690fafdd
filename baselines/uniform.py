"""`uniform`: the paper's Uniform baseline (method.md step 9), by name.

CluSTER's features and clusters (K = world size, soft cap), but instead of pruning every cluster
is up-sampled WITH replacement to the largest cluster's size, with unit weights. It is
`cluster` with `variant: uniform`; this file only gives it its own registry name so that grids
and result tables call it what the paper calls it.
"""

from __future__ import annotations

from typing import Any

from method.selector import ClusterSelector
from repro.core.config import ExperimentConfig
from repro.core.interfaces import SelectionContext
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection


@register_selector("uniform")
class UniformSelector:
    """The paper's Uniform: CluSTER's clusters, each up-sampled with replacement to the largest."""

    def __init__(
        self,
        feature_type: str = "gradient-proxy",
        normalization: str = "auto",
        cap: float | None = 1.5,
        kmeans: str = "exact",
        n_init: int = 10,
        max_iter: int = 300,
        feature_batch_size: int = 8,
        proj_dim: int = 8192,
        feature_workers: int | None = None,
    ) -> None:
        self.inner = ClusterSelector(
            feature_type=feature_type,
            normalization=normalization,
            cap=cap,
            kmeans=kmeans,
            variant="uniform",
            n_init=n_init,
            max_iter=max_iter,
            feature_batch_size=feature_batch_size,
            proj_dim=proj_dim,
            feature_workers=feature_workers,
        )

    def feature_key(self, cfg: ExperimentConfig) -> dict[str, Any] | None:
        """CluSTER's (the same features, so a `uniform` cell shares them with `cluster` cells)."""
        return self.inner.feature_key(cfg)

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        sel = self.inner.select(pool, budget, ctx)
        sel.info["method"] = "uniform"
        return sel
