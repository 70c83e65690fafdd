"""The defining property of `rds` (RDS+), `clusterclip` and `deita-*` (issue 15).

Real components: the tiny random Llama (transformers, CPU), scikit-learn, lm-eval's task for a
benchmark's dev split, the pipeline's stages. Embeddings and scores are recomputed here
independently (one example at a time, through the model's own `output_hidden_states` and loss),
never read from stored numbers.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from baselines.clusterclip import balanced_quotas
from baselines.common import scoring_model, target_examples, tokenize_pool
from baselines.deita import diversity_filter
from repro.core.config.load import from_dict
from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.io import read_json
from repro.core.registry import SELECTORS
from repro.core.types import Example, Pool
from tests.baselines_fixtures import one_torch_thread  # noqa: F401  (autouse fixture)
from tests.feature_helpers import plant_features

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]


def _ex(i: int, prompt: str, response: str) -> Example:
    return Example(id=f"e{i:03d}", prompt=prompt, response=response, source="t")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from repro.core.models import materialize_model

    work = tmp_path_factory.mktemp("targeted")
    cfg = from_dict(
        {},
        ["model.name_or_path=tiny-random-llama", "data.max_length=256", "world_size=2", f"data_dir={work}"],
    )
    return cfg, materialize_model(cfg.model, cfg.seed), work


def _ctx(cfg, workdir: Path, model_dir=None, seed: int = 0) -> SelectionContext:
    return SelectionContext(
        config=cfg, seed=seed, world_size=cfg.world_size, workdir=workdir, model_dir=model_dir
    )


def _mixed_pool(n: int = 16) -> Pool:
    """Word lists and digit lists, alternating."""
    r = np.random.default_rng(1)
    out = []
    for i in range(n):
        if i % 2:
            body = " ".join(str(d) for d in r.integers(0, 99, size=int(r.integers(3, 9))))
            out.append(_ex(i, f"Add up: {body}\n", str(int(r.integers(0, 500)))))
        else:
            out.append(_ex(i, "Repeat the words.\n", " ".join(r.choice(WORDS, size=int(r.integers(2, 9))))))
    return Pool(out)


def _write_alpaca(path: Path, rows: list[tuple[str, str]]) -> str:
    path.write_text(json.dumps([{"instruction": p, "input": "", "output": o} for p, o in rows]))
    return path.name


def _one_by_one(model, items) -> tuple[np.ndarray, np.ndarray]:
    """(mean final hidden state, response loss) per item, batch 1, through the model's own
    hidden-state output and loss: the independent path."""
    emb, loss = [], []
    with torch.no_grad():
        for it in items:
            ids = torch.tensor([it["input_ids"]])
            out = model(input_ids=ids, labels=torch.tensor([it["labels"]]), output_hidden_states=True)
            emb.append(out.hidden_states[-1][0].double().mean(0).numpy())
            loss.append(float(out.loss))
    return np.array(emb), np.array(loss)


def _unit(E: np.ndarray, center: bool = False) -> np.ndarray:
    E = E - E.mean(0) if center else E
    return E / np.linalg.norm(E, axis=1, keepdims=True)


# ----------------------------------------------------------------------------- rds


def test_rds_keeps_the_nearest_to_each_query_set_in_turn(tiny) -> None:
    """Two query files (word lists, digit lists). With one set the kept rows are the top by
    cosine to its nearest query example; with both, the sets take turns."""
    cfg, model_dir, work = tiny
    words = _write_alpaca(
        work / "q_words.json",
        [("Repeat the words.\n", "omega sigma beta"), ("Repeat the words.\n", "gamma alpha")],
    )
    digits = _write_alpaca(work / "q_digits.json", [("Add up: 4 17 80\n", "101")])
    pool = _mixed_pool()
    ctx = _ctx(cfg, work, model_dir)
    model, tok = scoring_model(ctx, "t")
    P, _ = _one_by_one(model, tokenize_pool(pool, tok, 256))
    cos = {}
    for name in (words, digits):
        Q, _ = _one_by_one(model, tokenize_pool(target_examples("t", "q", ctx, name, "alpaca", 9), tok, 256))
        cos[name] = (_unit(P) @ _unit(Q).T).max(axis=1)

    one = SELECTORS.create("rds", {"query": words}, "k").select(pool, 4, ctx)
    top = np.argsort(-cos[words], kind="stable")[:4]
    assert sorted(one.ids) == sorted(pool.ids[i] for i in top)

    both = SELECTORS.create("rds", {"query": [words, digits]}, "k").select(pool, 6, ctx)
    taken: list[int] = []
    while len(taken) < 6:  # round-robin, written out
        for name in (words, digits):
            if len(taken) < 6:
                taken.append(
                    max((i for i in range(len(pool)) if i not in taken), key=lambda i: (cos[name][i], -i))
                )
    assert sorted(both.ids) == sorted(pool.ids[i] for i in taken)
    assert both.info["kept_per_query"] == [3, 3] and both.info["n_query"] == [2, 1]


def test_rds_queries_a_benchmarks_dev_split_and_never_its_test_split(tiny, shared_data) -> None:
    work = tiny[2]
    ctx = _ctx(from_dict({}, [f"data_dir={shared_data}"]), work)
    dev = target_examples("rds", "selection.params.query", ctx, "mmlu_medical", "auto", 100)
    assert len(dev) == 30  # 5 dev rows for each of the six subjects
    assert all(e.prompt.endswith("Answer:") and e.response in (" A", " B", " C", " D") for e in dev.examples)
    with pytest.raises(SelectionError, match="pubmedqa_local has no validation split"):
        target_examples("rds", "selection.params.query", ctx, "pubmedqa", "auto", 100)


# ----------------------------------------------------------------------------- clusterclip


def _planted(tmp_path: Path, sizes: list[int]) -> tuple[Pool, SelectionContext]:
    """Well-separated planted clusters, written as CluSTER's features (embedding: gradient)."""
    n = sum(sizes)
    X = np.zeros((n, 8), dtype=np.float32)
    X[np.arange(n), np.repeat(np.arange(len(sizes)), sizes)] = 5.0
    X += 0.1 * np.random.default_rng(0).standard_normal(X.shape).astype(np.float32)
    pool = Pool([_ex(i, f"p{i}", f"r{i}") for i in range(n)])
    plant_features(tmp_path, X, pool)
    return pool, _ctx(from_dict({}, ["world_size=2"]), tmp_path)


def test_clusterclip_balances_clusters_and_clips_repeats(tmp_path: Path) -> None:
    """Clusters of 2, 6 and 16. Budget 6: two distinct per cluster. Budget 24: 8 per cluster is
    fair, but the 2-member cluster is clipped at 2 x 2 = 4 draws and its share passes on (10
    and 10: the 6-member cluster repeats 4 of its members); draws inside a cluster go round its
    members, so their counts differ by at most one."""
    pool, ctx = _planted(tmp_path, [2, 6, 16])
    params = {"n_clusters": 3, "max_repeats": 2, "embedding": "gradient"}

    def make():
        return SELECTORS.create("clusterclip", params, "k")

    small = make().select(pool, 6, ctx)
    assert sorted(Counter(small.clusters).values()) == [2, 2, 2]
    assert len(set(small.ids)) == 6 and small.diagnostics.with_replacement is False

    big = make().select(pool, 24, ctx)
    assert len(big.ids) == 24 and big.diagnostics.with_replacement is True
    by_size = {size: c for c, size in enumerate(big.diagnostics.cluster_sizes_before_cap)}
    draws = Counter(big.clusters)
    assert [draws[by_size[s]] for s in (2, 6, 16)] == [4, 10, 10]
    counts = Counter(big.ids)
    assert max(counts.values()) <= 2
    labels = _labels(big, pool)
    for size in (2, 6):  # every member of the clipped clusters drawn, evenly
        per_member = [counts[i] for i, c in zip(pool.ids, labels) if c == by_size[size]]
        assert len(per_member) == size and max(per_member) - min(per_member) <= 1
    assert big.info["n_distinct"] == 2 + 6 + 10 and big.info["n_repeated_draws"] == 6
    assert balanced_quotas(np.array([4, 12, 32]), 24).tolist() == [4, 10, 10]
    with pytest.raises(SelectionError, match="cannot draw 50"):
        balanced_quotas(np.array([4, 12, 32]), 50)


def _labels(sel, pool: Pool) -> list[int]:
    """Each pool example's cluster (from the draws; -1 when never drawn)."""
    of = dict(zip(sel.ids, sel.clusters))
    return [of.get(i, -1) for i in pool.ids]


def test_clusterclip_repeats_flow_through_the_pipeline(tmp_path: Path) -> None:
    """The whole pool as budget on the skewed demo pool: small clusters repeat, the repeated ids
    pass the selection check, the allocator deals every draw, kept_fraction counts distinct."""
    from repro.pipeline import run_experiment

    cfg = from_dict(
        {},
        [
            f"output_dir={tmp_path}",
            "name=x",
            "model.name_or_path=tiny-random-llama",
            "data.sources=[{path: demo, params: {train_size: 40, heldout_per_category: 1}}]",
            "world_size=2",
            "train.per_device_batch_size=1",
            "train.global_batch_size=2",
            "selection.method=clusterclip",
            "selection.fraction=1.0",
            "selection.params.n_clusters=4",
            "selection.params.max_repeats=3",
        ],
    )
    run_dir = run_experiment(cfg, until="schedule")
    sel = read_json(run_dir / "stages" / "select.json")
    assert sel["n_selected"] == sel["n_pool"] > sel["n_unique"]
    assert sel["kept_fraction"] == pytest.approx(sel["n_unique"] / sel["n_pool"])
    rows = list(csv.DictReader((run_dir / "selection.csv").read_text().splitlines()))
    assert len(rows) == -(-sel["n_selected"] // 2) * 2  # every draw dealt, padded to 2 workers
    assert 1 < max(Counter(r["example_id"] for r in rows).values()) <= 3


# ----------------------------------------------------------------------------- deita


def test_the_diversity_filter_skips_what_is_near_an_earlier_pick() -> None:
    """Score order a, a2, b, c: a2 is at cosine 0.99 of a, c at 0.95 of b. At threshold 0.1 both
    are too near (a2 refills the budget, best score first); at 0.03 c is far enough."""

    def unit(v):
        return np.array(v) / np.linalg.norm(v)

    a, b = unit([1, 0, 0]), unit([0, 1, 0])
    a2 = unit([0.99, np.sqrt(1 - 0.99**2), 0])
    c = unit([0, 0.95, np.sqrt(1 - 0.95**2)])
    E, order = np.stack([a, a2, b, c]), np.arange(4)
    rows, refilled = diversity_filter(order, E, 3, 0.1)
    assert rows.tolist() == [0, 2, 1] and refilled == 1
    rows, refilled = diversity_filter(order, E, 3, 0.03)
    assert rows.tolist() == [0, 2, 3] and refilled == 0
    assert diversity_filter(order, E, 2, 0.1)[0].tolist() == [0, 2]


def test_deita_perplexity_sorts_by_the_models_perplexity_and_skips_copies(tiny) -> None:
    """Three examples appear twice: a copy has the same embedding (distance 0), so it is never
    picked while distinct examples remain. The kept texts equal the filter applied here to the
    response perplexities and centered embeddings computed one example at a time."""
    cfg, model_dir, work = tiny
    base = _mixed_pool(12).examples
    pool = Pool(base + [_ex(100 + j, base[j].prompt, base[j].response) for j in (0, 3, 6)])
    ctx = _ctx(cfg, work, model_dir)
    sel = SELECTORS.create("deita-perplexity", {"threshold": 1e-3}, "k").select(pool, 8, ctx)
    assert sel.info["method"] == "deita-perplexity" and sel.info["n_refilled"] == 0
    model, tok = scoring_model(ctx, "t")
    E, loss = _one_by_one(model, tokenize_pool(pool, tok, 256))
    E = _unit(E, center=True)
    kept: list[int] = []
    for i in np.argsort(-np.exp(loss), kind="stable"):
        if len(kept) < 8 and all(1 - E[i] @ E[j] > 1e-3 for j in kept):
            kept.append(int(i))
    text = {e.id: (e.prompt, e.response) for e in pool.examples}
    assert sorted(text[i] for i in sel.ids) == sorted(text[pool.ids[i]] for i in kept)
    assert len({text[i] for i in sel.ids}) == 8  # never both copies
