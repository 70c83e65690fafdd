"""Features planted as a selector's cache (what CluSTER's feature pass leaves in the run folder),
for tests that run the selection on chosen features without a model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from method.features import pool_fingerprint
from repro.core.types import Pool


def plant_features(folder: Path, X: np.ndarray, pool: Pool) -> None:
    """`X` as `folder`'s features.npy, with the features.json the gradient-proxy pass writes for
    `pool` (its type, size and the pool's fingerprint: what reuse checks)."""
    np.save(folder / "features.npy", X)
    meta = {
        "feature_type": "gradient-proxy",
        "n": len(X),
        "dim": int(X.shape[1]),
        "seconds": 0.0,
        "feature_max_length": None,
        "pool_fingerprint": pool_fingerprint(e.to_dict() for e in pool.examples),
    }
    (folder / "features.json").write_text(json.dumps(meta))
