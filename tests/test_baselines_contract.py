"""The contract every registered selector keeps (issue 4), checked on one small real pool.

For each built-in selector: the right count, ids valid and unique (unless it says it samples with
replacement), the same selection for the same seed, a clear SelectionError for a budget larger
than the pool, and for a pool too small for its parameters. Model-based selectors use the tiny
random Llama (real transformers/peft, CPU); the pool is the generated demo pool, filtered as the
pipeline's pool stage does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.core.config.load import from_dict
from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.io import atomic_write_jsonl
from repro.core.registry import SELECTORS
from repro.core.types import Pool
from repro.pipeline import validate_selection
from tests.baselines_fixtures import BASELINES, one_torch_thread  # noqa: F401  (autouse fixture)

# Selectors that set their own kept count (a budget is an error for them).
SELF_COUNTED = {"full", "cluster", "uniform"}
# Small-pool parameters: keep each method's structure, shrink its sizes to a 40-example pool.
PARAMS = {
    "cluster": {"ratio": 50, "n_init": 2},
    "uniform": {"n_init": 2},
    "semdedup": {"n_clusters": 3},
    "ccs": {"n_strata": 4},
    "less": {"warmup_min": 4, "epochs": 2, "proj_dim": 128},
    "s2l": {"n_clusters": 3, "epochs": 1, "n_checkpoints": 3},
    "clusterclip": {"n_clusters": 3},
}
# Parameters that need a bigger pool than 40 examples: each must be refused with a clear message.
TOO_SMALL = {
    "semdedup": ({"n_clusters": 41}, r"fewer than selection\.params\.n_clusters = 41"),
    "ccs": ({"n_strata": 41}, r"fewer than selection\.params\.n_strata = 41"),
    "s2l": ({"n_clusters": 41}, r"fewer than selection\.params\.n_clusters = 41"),
    "less": ({"warmup_min": 41}, r"fewer than the warm-up size"),
    "clusterclip": ({"n_clusters": 41}, r"fewer than selection\.params\.n_clusters = 41"),
    "cluster": ({}, r"K|cluster"),
    "uniform": ({}, r"K|cluster"),
}
ISSUE_SELECTORS = BASELINES | {"uniform"}
K = 2  # world size (CluSTER's K) for the cluster-based selectors


def builtin_selectors() -> list[str]:
    return [n for n in SELECTORS.names() if SELECTORS.origin(n).startswith(("baselines.", "method."))]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):
    """(pool, context factory): a 40-example demo pool, its run files, the tiny model, features."""
    from method.features import features_to_file
    from repro.core.data import load_pool
    from repro.core.models import load_model_and_tokenizer, materialize_model
    from repro.core.tokens import TokenizedPool

    work = tmp_path_factory.mktemp("contract")
    cfg = from_dict(
        {},
        [
            "model.name_or_path=tiny-random-llama",
            "data.sources=[{path: demo, params: {train_size: 40, heldout_per_category: 1}}]",
            "data.max_length=256",
            f"world_size={K}",
        ],
    )
    train, held = load_pool(cfg)
    model_dir = materialize_model(cfg.model, cfg.seed)
    _, tok = load_model_and_tokenizer(model_dir, cfg.model)
    tp = TokenizedPool(train, tok, cfg.data.max_length, on_bad_row="skip")
    pool = Pool([e for e in train.examples if e.id in tp], "train")
    atomic_write_jsonl(work / "pool.jsonl", [e.to_dict() for e in pool.examples])
    atomic_write_jsonl(work / "heldout.jsonl", [e.to_dict() for e in held.examples])
    # CluSTER's features for `cluster` and `uniform`, computed once in this process (they would
    # otherwise spawn K feature workers per call; the selector reuses a complete features.npy).
    features_to_file(work, 1, model_dir, cfg.model, cfg.data.max_length, 8, work / "features.npy")

    def ctx(seed: int = 0, workdir: Path = work) -> SelectionContext:
        return SelectionContext(config=cfg, seed=seed, world_size=K, workdir=workdir, model_dir=model_dir)

    return pool, ctx


def test_every_selector_the_issue_names_is_registered() -> None:
    assert ISSUE_SELECTORS | {"full", "cluster"} <= set(builtin_selectors())


def _expected_count(name: str, sel, pool: Pool, budget: int) -> int:
    if name == "full":
        return len(pool)
    if name == "cluster":
        return K * sel.info["m_adj"]
    if name == "uniform":
        return K * max(sel.diagnostics.cluster_sizes_after_cap)
    return budget


@pytest.mark.parametrize("name", builtin_selectors())
def test_selector_contract(name: str, env) -> None:
    pool, ctx = env
    budget = None if name in SELF_COUNTED else 12
    params = PARAMS.get(name, {})
    a = SELECTORS.create(name, params, "selection.params").select(pool, budget, ctx(seed=3))
    validate_selection(a, pool, name)  # ids in the pool, unique unless with_replacement, lengths
    assert len(a.ids) == _expected_count(name, a, pool, budget)
    if not a.diagnostics.with_replacement:
        assert len(set(a.ids)) == len(a.ids)
    # Deterministic for a seed: a fresh instance, the same seed, the same selection.
    b = SELECTORS.create(name, params, "selection.params").select(pool, budget, ctx(seed=3))
    assert a.ids == b.ids and a.clusters == b.clusters
    if a.scores is not None:
        assert a.scores == pytest.approx(b.scores, rel=1e-6, abs=1e-9)

    # A budget larger than the pool (or any budget, for selectors that set their own count).
    too_big = len(pool) + 1
    with pytest.raises(
        SelectionError, match="larger than the pool" if budget else "own kept count|keeps all"
    ):
        SELECTORS.create(name, params, "selection.params").select(pool, too_big, ctx())


@pytest.mark.parametrize("name", sorted(TOO_SMALL))
def test_a_pool_too_small_for_the_parameters_is_refused(name: str, env) -> None:
    pool, ctx = env
    params, message = TOO_SMALL[name]
    if name in ("cluster", "uniform"):  # K = 64 clusters cannot be made from 40 examples
        c = ctx()
        c.world_size = 64
        with pytest.raises(SelectionError, match=message):
            SELECTORS.create(name, {**PARAMS.get(name, {}), **params}, "k").select(pool, None, c)
        return
    with pytest.raises(SelectionError, match=message):
        SELECTORS.create(name, {**PARAMS.get(name, {}), **params}, "k").select(pool, 5, ctx())


@pytest.mark.parametrize(
    "name",
    ["random", "loss", "grand", "perplexity", "ccs", "ifd", "less", "s2l", "rds", "clusterclip", "deita-ifd"],
)
def test_budgeted_selectors_ask_for_a_budget(name: str, env) -> None:
    pool, ctx = env
    with pytest.raises(SelectionError, match="needs a budget"):
        SELECTORS.create(name, PARAMS.get(name, {}), "k").select(pool, None, ctx())
