"""Shared-feature keys: which cells of an experiment file can share one feature pass.

A selector that computes features from the model and the pool alone (CluSTER's gradient-proxy
features: not the ratio, not the world size, not the budget) says what else identifies them
through its optional `feature_key(cfg)` method (repro/core/interfaces.py). Cells whose selectors
say the same, on the same model and the same pool, get the same key: the launcher computes their
pool and features once, in `<output_dir>/_shared/features/<key>/`, and links them into each cell's
run folder (slurm/jobs.py). The selector owns its defaults, so a changed default changes the key.

What the key hashes, before any data is read (the plan needs it):
- the pool's definition: `data` (sources, limits, max_length, held-out share, ...). The seed
  enters only where it changes the pool (`pool_seed_uses`): a held-out split drawn from a source
  (heldout_fraction > 0), and a registered source that declares its rows seeded (the generated
  demo pool). With heldout_fraction 0 (the paper's recipe) the seeds of a dataset x model share
  one pass;
- the model: `model` without its LoRA settings (the features use the initial base model). The
  seed enters only for the builtin tiny random model, whose weights it draws. The config names
  no revision beyond `name_or_path`; the model stage's fingerprint (repro/core/fingerprints.py)
  catches changed weights;
- the feature settings (the selector's `feature_key`), and `selection_seed` when set.
What the pool *is* (its example ids and content fingerprints, in order: `pool_fingerprint`) is
recorded in the features' metadata when they are written, and a features file is reused only for
the same pool (method/features.py), so files that changed under an unchanged config are never
reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from repro.core.config.schema import ExperimentConfig
from repro.core.registry import SELECTORS


def feature_pass(cfg: ExperimentConfig) -> dict[str, Any] | None:
    """What identifies the features `cfg`'s selector computes (its `feature_key(cfg)`), or None
    when it computes none that can be shared (or has no such method)."""
    selector = SELECTORS.create(cfg.selection.method, cfg.selection.params, "selection.params")
    key = getattr(selector, "feature_key", None)
    return key(cfg) if callable(key) else None


def pool_seed_uses(cfg: ExperimentConfig) -> list[str]:
    """Where `cfg.seed` changes the pool or the model the features are computed from (empty: the
    seed changes neither, so cells that differ only in it share one feature pass). Every use of
    the seed on the way to the features: a registered source that declares its rows seeded (the
    demo pool's generator; repro/core/sources.py), the held-out split of every source that gives
    no held-out rows of its own (repro/core/data.py `_load_source`; heldout_fraction > 0), and
    the tiny random model's weights (repro/core/models.py materialize_model)."""
    from repro.core.sources import declared

    uses = []
    classes = [declared(s.path) for s in cfg.data.sources]
    for i, (src, cls) in enumerate(zip(cfg.data.sources, classes)):
        if getattr(cls, "seeded", False):
            uses.append(f"data.sources[{i}]: the {src.path!r} source draws its rows from the seed")
    if cfg.data.heldout_fraction > 0 and any(not getattr(c, "own_heldout", False) for c in classes):
        uses.append(
            f"data.heldout_fraction = {cfg.data.heldout_fraction}: the held-out split is drawn from the seed"
        )
    if cfg.model.name_or_path == "tiny-random-llama":
        uses.append("model: the tiny random model's weights are drawn from the seed")
    proxy = cfg.selection.params.get("proxy_model")
    if (proxy if isinstance(proxy, str) else (proxy or {}).get("name_or_path")) == "tiny-random-llama":
        uses.append("selection.params.proxy_model: the tiny random proxy's weights are drawn from the seed")
    return uses


def feature_key(cfg: ExperimentConfig) -> str | None:
    """12 hex digits shared by every config with the same pool and the same features; None when
    its selector computes no shareable features. The world size, the budget and the allocation
    do not enter."""
    features = feature_pass(cfg)
    if features is None:
        return None
    model = dataclasses.asdict(cfg.model)
    model.pop("lora", None)  # the features use the initial base model, never the adapter
    if cfg.model.name_or_path != "tiny-random-llama":
        model.pop("tiny_hidden_size", None)
        model.pop("tiny_layers", None)
    key: dict[str, Any] = {"model": model, "data": dataclasses.asdict(cfg.data), "features": features}
    if pool_seed_uses(cfg):
        key["seed"] = cfg.seed
    key["selection_seed"] = cfg.selection_seed  # features may draw from it
    blob = json.dumps(
        key,
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
