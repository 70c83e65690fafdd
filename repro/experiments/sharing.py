"""Shared-feature keys: which cells of a grid can share one feature pass.

A selector that computes features from the model and the pool alone (CluSTER's gradient-proxy
features: not the ratio, not the world size, not the budget) says what else identifies them
through its optional `feature_key(cfg)` method (repro/core/interfaces.py). Cells whose selectors
say the same, on the same model, data and seed (the seed draws the held-out split, hence the pool),
get the same key: the launcher computes their pool and features once, in
`<output_dir>/_shared/features/<key>/`, and links them into each cell's run folder
(slurm/jobs.py). The selector owns its defaults, so a changed default changes the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from repro.core.config import ExperimentConfig
from repro.core.registry import SELECTORS


def feature_pass(cfg: ExperimentConfig) -> dict[str, Any] | None:
    """What identifies the features `cfg`'s selector computes (its `feature_key(cfg)`), or None
    when it computes none that can be shared (or has no such method)."""
    selector = SELECTORS.create(cfg.selection.method, cfg.selection.params, "selection.params")
    key = getattr(selector, "feature_key", None)
    return key(cfg) if callable(key) else None


def feature_key(cfg: ExperimentConfig) -> str | None:
    """12 hex digits shared by every config with the same pool and the same features; None when
    its selector computes no shareable features. The world size, the budget and the allocation
    do not enter."""
    features = feature_pass(cfg)
    if features is None:
        return None
    key: dict[str, Any] = {
        "model": dataclasses.asdict(cfg.model),
        "data": dataclasses.asdict(cfg.data),
        "seed": cfg.seed,
        "features": features,
    }
    if cfg.selection_seed is not None:  # features may draw from it; unset: keys as before
        key["selection_seed"] = cfg.selection_seed
    blob = json.dumps(
        key,
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
