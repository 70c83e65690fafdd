"""Each baseline's defining property, one test per method (issue 4).

Real components throughout: the tiny random Llama (transformers + peft, CPU), datasketch,
sentence-transformers with the offline all-MiniLM-L6-v2 package, scikit-learn. Scores are checked
against an independent per-example computation (a batch-1 loop), not against stored numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from repro.core.config.load import from_dict
from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.io import atomic_write_jsonl
from repro.core.registry import SELECTORS
from repro.core.types import Example, Pool
from tests.baselines_fixtures import one_torch_thread  # noqa: F401  (autouse fixture)
from tests.feature_helpers import plant_features


def _ex(i: int, prompt: str, response: str, category: str | None = None) -> Example:
    return Example(id=f"e{i:03d}", prompt=prompt, response=response, source="t", category=category)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """(config, model_dir) of the tiny random Llama (byte-level tokenizer)."""
    from repro.core.models import materialize_model

    cfg = from_dict({}, ["model.name_or_path=tiny-random-llama", "data.max_length=128", "world_size=2"])
    return cfg, materialize_model(cfg.model, cfg.seed)


def _ctx(cfg, tmp_path: Path, model_dir=None, seed: int = 0) -> SelectionContext:
    return SelectionContext(
        config=cfg, seed=seed, world_size=cfg.world_size, workdir=tmp_path, model_dir=model_dir
    )


def _text_pool(n: int = 24) -> Pool:
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    r = np.random.default_rng(0)
    return Pool(
        [
            _ex(i, f"Task {i}: repeat the words.\n", " ".join(r.choice(words, size=int(r.integers(2, 12)))))
            for i in range(n)
        ]
    )


# ----------------------------------------------------------------------------- uniform


def test_uniform_upsamples_every_cluster_to_the_largest(tmp_path: Path) -> None:
    """Planted clusters of 6 and 10 (features written as CluSTER's features.npy): Uniform keeps
    every example and draws extra members of the small cluster with replacement up to 10."""
    pool = Pool([_ex(i, f"p{i}", f"r{i}") for i in range(16)])
    r = np.random.default_rng(0)
    X = np.zeros((16, 8), dtype=np.float32)
    X[:6, 0], X[6:, 1] = 5.0, 5.0
    X += 0.1 * r.standard_normal(X.shape).astype(np.float32)
    plant_features(tmp_path, X, pool)
    cfg = from_dict({}, ["world_size=2"])
    sel = SELECTORS.create("uniform", {"n_init": 2}, "k").select(pool, None, _ctx(cfg, tmp_path))
    assert sel.info["method"] == "uniform" and sel.diagnostics.with_replacement is True
    assert sorted(sel.diagnostics.cluster_sizes_after_cap) == [6, 10]
    counts = np.bincount(sel.clusters)
    assert counts.tolist() == [10, 10]
    assert set(sel.ids) == set(pool.ids)  # nothing pruned
    assert sel.group_weights == {0: 1.0, 1: 1.0}


# ----------------------------------------------------------------------------- dedup


def test_dedup_exact_removes_normalized_duplicates(tmp_path: Path) -> None:
    pool = Pool(
        [
            _ex(0, "Add 2 and 3.", "5"),
            _ex(1, "add  2 and 3. ", "5"),
            _ex(2, "ADD 2 AND 3.", "5\n"),
            _ex(3, "Add 2 and 4.", "6"),
            _ex(4, "Add 2 and 3.", "6"),
        ]
    )
    cfg = from_dict({})
    sel = SELECTORS.create("dedup-exact", {}, "k").select(pool, None, _ctx(cfg, tmp_path))
    assert sel.ids == ["e000", "e003", "e004"]  # first of each normalized (prompt, response)
    assert sel.info["n_duplicates"] == 2 and sel.info["n_unique"] == 3
    # Budget below the unique count: a random sample of unique ones; above it: refilled, and said.
    two = SELECTORS.create("dedup-exact", {}, "k").select(pool, 2, _ctx(cfg, tmp_path))
    assert set(two.ids) < {"e000", "e003", "e004"} and two.info["sampled_away"] == 1
    four = SELECTORS.create("dedup-exact", {}, "k").select(pool, 4, _ctx(cfg, tmp_path))
    assert {"e000", "e003", "e004"} < set(four.ids) and four.info["refilled_with_duplicates"] == 1
    by_prompt = SELECTORS.create("dedup-exact", {"fields": "prompt"}, "k").select(
        pool, None, _ctx(cfg, tmp_path)
    )
    assert by_prompt.ids == ["e000", "e003"]


LONG = (
    "the patient reports a persistent dry cough for three weeks with mild fever at night "
    "and fatigue during the day no chest pain and no shortness of breath was noted by the "
    "examining physician who recommended rest fluids and a follow up visit"
)


def test_minhash_drops_a_planted_near_duplicate_and_keeps_a_distinct_item(tmp_path: Path) -> None:
    near = LONG.replace("three weeks", "two weeks")
    distinct = (
        "write a python function that returns the running maximum of a list of integers "
        "using a single pass and constant extra memory"
    )
    pool = Pool([_ex(0, "Summarize.", LONG), _ex(1, "Write code.", distinct), _ex(2, "Summarize.", near)])
    cfg = from_dict({})
    sel = SELECTORS.create("dedup-minhash", {"threshold": 0.7}, "k").select(pool, None, _ctx(cfg, tmp_path))
    assert sel.ids == ["e000", "e001"] and sel.info["n_duplicates"] == 1
    strict = SELECTORS.create("dedup-minhash", {"threshold": 0.95}, "k").select(
        pool, None, _ctx(cfg, tmp_path)
    )
    assert strict.ids == ["e000", "e001", "e002"]  # the threshold is what decides
    with pytest.raises(SelectionError, match="no LSH band layout"):
        SELECTORS.create("dedup-minhash", {"threshold": 0.999}, "k").select(pool, None, _ctx(cfg, tmp_path))


def test_semdedup_drops_semantic_near_duplicates_inside_clusters(tmp_path: Path, tiny) -> None:
    pool = Pool(
        [
            _ex(0, "What is the capital of France?", "The capital of France is Paris."),
            _ex(1, "what is the capital of france", "the capital of france is paris"),
            _ex(2, "Sort a list in Python.", "Use sorted(xs) to get a new sorted list."),
            _ex(3, "Name a primary color.", "Red is a primary color."),
            _ex(4, "How many legs does a spider have?", "A spider has eight legs."),
        ]
    )
    cfg, model_dir = tiny
    sel = SELECTORS.create("semdedup", {"n_clusters": 2, "threshold": 0.85}, "k").select(
        pool, None, _ctx(cfg, tmp_path, model_dir)
    )
    assert len(sel.ids) == 4 and len({"e000", "e001"} & set(sel.ids)) == 1
    assert {"e002", "e003", "e004"} <= set(sel.ids)
    # The target model's own (mean hidden state) embedding: an exact copy has cosine 1.
    copy = Pool([*pool.examples, _ex(5, pool.examples[2].prompt, pool.examples[2].response)])
    own = SELECTORS.create(
        "semdedup", {"embedding": "model", "n_clusters": 1, "threshold": 0.9999}, "k"
    ).select(copy, None, _ctx(cfg, tmp_path, model_dir))
    assert len({"e002", "e005"} & set(own.ids)) == 1 and own.info["n_duplicates"] >= 1


# ----------------------------------------------------------------------------- pruning


def _reference_losses(cfg, model_dir, pool: Pool, all_tokens: bool = False):
    """Batch-1 reference: each example alone through the model, the trainer's loss, plus EL2N."""
    from baselines.common import scoring_model
    from repro.core.lmhead import weighted_lm_loss
    from repro.core.tokens import collate, tokenize_example

    model, tok = scoring_model(_ctx(cfg, Path("."), model_dir), "reference")  # no LoRA, eval
    losses, el2n = [], []
    with torch.no_grad():
        for e in pool.examples:
            item = tokenize_example(e, tok, cfg.data.max_length)
            if all_tokens:
                item = {**item, "labels": list(item["input_ids"])}
            b = collate([item], tok.pad_token_id)
            logits = model(input_ids=b["input_ids"]).logits
            losses.append(float(weighted_lm_loss(logits, b["labels"], torch.ones(1))))
            t = b["labels"][0, 1:]
            m = t != -100
            p = torch.softmax(logits[0, :-1][m].double(), -1)
            onehot = torch.nn.functional.one_hot(t[m], p.shape[-1]).double()
            el2n.append(float((p - onehot).norm(dim=-1).mean()))
    return np.array(losses), np.array(el2n)


def _assert_keeps_top(sel, pool: Pool, ref: np.ndarray, k: int, rel: float) -> None:
    """The selection is the k highest of `ref` and carries those reference scores."""
    assert set(sel.ids) == {pool.ids[i] for i in np.argsort(-ref)[:k]}
    want = {e.id: ref[i] for i, e in enumerate(pool.examples)}
    assert dict(zip(sel.ids, sel.scores)) == pytest.approx({i: want[i] for i in sel.ids}, rel=rel)


def test_loss_keeps_the_highest_per_example_losses(tmp_path: Path, tiny) -> None:
    cfg, model_dir = tiny
    pool = _text_pool()
    ref_loss, ref_el2n = _reference_losses(cfg, model_dir, pool)
    for score, ref in (("loss", ref_loss), ("el2n", ref_el2n)):
        sel = SELECTORS.create("loss", {"score": score}, "k").select(pool, 6, _ctx(cfg, tmp_path, model_dir))
        _assert_keeps_top(sel, pool, ref, 6, 1e-4)


def test_perplexity_scores_the_whole_text_and_can_keep_the_middle(tmp_path: Path, tiny) -> None:
    cfg, model_dir = tiny
    pool = _text_pool()
    ref = np.exp(_reference_losses(cfg, model_dir, pool, all_tokens=True)[0])
    ctx = _ctx(cfg, tmp_path, model_dir)
    _assert_keeps_top(SELECTORS.create("perplexity", {}, "k").select(pool, 6, ctx), pool, ref, 6, 1e-4)
    mid = SELECTORS.create("perplexity", {"keep": "middle"}, "k").select(pool, 6, ctx)
    ranked = [pool.ids[i] for i in np.argsort(ref)]
    assert set(mid.ids) == set(ranked[9:15])  # 24 examples: ranks 9..14 around the median


def test_grand_scores_are_per_example_lora_gradient_norms(tmp_path: Path, tiny) -> None:
    from repro.core.lmhead import weighted_lm_loss
    from repro.core.models import load_model_and_tokenizer
    from repro.core.runtime import seed_everything
    from repro.core.tokens import collate, tokenize_example

    cfg, model_dir = tiny
    pool = _text_pool(12)
    sel = SELECTORS.create("grand", {}, "k").select(pool, 4, _ctx(cfg, tmp_path, model_dir, 5))
    seed_everything(5)  # the selector draws LoRA's A from the run seed the same way
    model, tok = load_model_and_tokenizer(model_dir, cfg.model)
    params = [p for p in model.parameters() if p.requires_grad]
    ref = []
    for e in pool.examples:
        b = collate([tokenize_example(e, tok, cfg.data.max_length)], tok.pad_token_id)
        loss = weighted_lm_loss(model(input_ids=b["input_ids"]).logits, b["labels"], torch.ones(1))
        ref.append(float(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]).norm()))
    ref = np.array(ref)
    assert ref.min() > 0
    _assert_keeps_top(sel, pool, ref, 4, 1e-3)


def test_ccs_drops_the_hardest_and_covers_every_stratum(tmp_path: Path, tiny) -> None:
    from baselines.ccs import strata_of

    cfg, model_dir = tiny
    pool = _text_pool(40)
    params = {"score": "loss", "hard_cutoff": 0.1, "n_strata": 5}
    sel = SELECTORS.create("ccs", params, "k").select(pool, 10, _ctx(cfg, tmp_path, model_dir))
    ref = _reference_losses(cfg, model_dir, pool)[0]
    hardest = {pool.ids[i] for i in np.argsort(-ref)[:4]}
    assert not hardest & set(sel.ids)
    rest = np.argsort(-ref)[4:]
    strata = strata_of(ref[rest], 5)
    kept = {pool.ids.index(i) for i in sel.ids}
    for s in range(5):
        members = {int(r) for r in rest[strata == s]}
        if members:
            assert members & kept, f"stratum {s} ({len(members)} examples) got nothing"
    assert sel.info["stratum_kept"] == [len({int(r) for r in rest[strata == s]} & kept) for s in range(5)]


def test_spreading_a_budget_evenly_smallest_first() -> None:
    from baselines.common import spread_over_groups

    groups = [np.arange(0, 2), np.arange(2, 30), np.arange(30, 35), np.arange(35, 36)]
    out = spread_over_groups(groups, 16, np.random.default_rng(0))
    # Water-filling: groups of 1, 2, 5 are taken whole, the remaining 8 go to the big one.
    assert [len(o) for o in out] == [2, 8, 5, 1]
    out = spread_over_groups(groups, 9, np.random.default_rng(0))
    assert [len(o) for o in out] == [2, 3, 3, 1]
    assert all(set(o) <= set(g) for o, g in zip(out, groups))


# ----------------------------------------------------------------------------- IFD


def _memorizing_model(tmp_path: Path, tiny, pairs: list[tuple[str, str]], steps: int = 60):
    """The tiny model, trained to give each response after its prompt (a real, small fit)."""
    from baselines.common import scoring_model, train_briefly
    from repro.core.tokens import tokenize_example

    cfg, model_dir = tiny
    model, tok = scoring_model(_ctx(cfg, tmp_path, model_dir), "memorize")  # all weights trained
    items = [tokenize_example(_ex(i, p, r), tok, 128) for i, (p, r) in enumerate(pairs)]
    train_briefly(model, items, tok.pad_token_id, steps, 1e-2, len(items), 0)  # one batch a step
    out = tmp_path / "memorized"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_ifd_ranks_a_response_the_instruction_explains_below_one_it_does_not(tmp_path: Path, tiny) -> None:
    from baselines.ifd import ifd_order

    pairs = [("Secret one?\n", "zqx wvk jfp"), ("Secret two?\n", "mbl ryh dco")]
    model_dir = _memorizing_model(tmp_path, tiny, pairs)
    cfg = tiny[0]
    pool = Pool(
        [
            _ex(0, "Secret one?\n", "zqx wvk jfp"),  # the instruction explains it
            _ex(1, "Secret one?\n", "mbl ryh dco"),
        ]
    )  # the response belongs elsewhere
    sel = SELECTORS.create("ifd", {}, "k").select(pool, 2, _ctx(cfg, tmp_path, model_dir))
    ifd = dict(zip(sel.ids, sel.scores))
    assert ifd["e000"] < ifd["e001"]
    assert ifd["e000"] < 1
    # Keeping order: highest IFD below 1 first, then IFD >= 1 from the lowest, unscored last.
    assert ifd_order(np.array([0.5, 1.5, 0.9, np.nan, 1.1])).tolist() == [2, 0, 4, 1, 3]


# ----------------------------------------------------------------------------- LESS, S2L


def test_less_prefers_examples_like_the_validation_set(tmp_path: Path, tiny) -> None:
    """Validation examples of one task: pool examples of that task score higher than others."""
    cfg, model_dir = tiny
    r = np.random.default_rng(1)
    task_a = [(f"Reverse the digits of {n}.\n", str(n)[::-1]) for n in r.integers(1000, 99999, 20)]
    task_b = [
        ("Say it louder.\n", w.upper() + "!")
        for w in r.choice(["quiet please", "hello there", "good morning", "see you soon"], 20)
    ]
    pool = Pool([_ex(i, p, q, "a" if i < 20 else "b") for i, (p, q) in enumerate(task_a + task_b)])
    val = [
        _ex(100 + i, f"Reverse the digits of {n}.\n", str(n)[::-1]).to_dict()
        for i, n in enumerate(r.integers(1000, 99999, 6))
    ]
    atomic_write_jsonl(tmp_path / "heldout.jsonl", val)
    sel = SELECTORS.create("less", {"warmup_min": 8, "epochs": 2, "proj_dim": 512}, "k").select(
        pool, 20, _ctx(cfg, tmp_path, model_dir)
    )
    picked_a = sum(1 for i in sel.ids if int(i[1:]) < 20)
    assert picked_a >= 15, f"only {picked_a} of 20 kept examples are from the validation task"
    assert len(sel.info["checkpoints"]) == 2


def test_s2l_spreads_the_budget_over_trajectory_clusters_smallest_first(tmp_path: Path, tiny) -> None:
    cfg, model_dir = tiny
    pool = _text_pool(30)
    sel = SELECTORS.create("s2l", {"n_clusters": 4, "epochs": 2, "n_checkpoints": 4}, "k").select(
        pool, 12, _ctx(cfg, tmp_path, model_dir)
    )
    T = np.load(tmp_path / "s2l_trajectories.npy")
    assert T.shape == (30, 4)
    assert T[:, -1].mean() < T[:, 0].mean()  # the proxy learned: losses fall along trajectories
    sizes, kept = np.array(sel.diagnostics.cluster_sizes_before_cap), np.array(sel.info["cluster_kept"])
    assert kept.sum() == 12 and (kept <= sizes).all()
    assert np.bincount(sel.clusters, minlength=len(sizes)).tolist() == kept.tolist()
    # Even spread: clusters not taken whole get equal shares (within one); any cluster taken
    # whole is no larger than the others' shares.
    partial = kept[kept < sizes]
    if partial.size:
        assert partial.max() - partial.min() <= 1
        assert (sizes[kept == sizes] <= partial.max()).all()
    # Each example's cluster is that of its trajectory: k-means labels of T.
    from baselines.s2l import kmeans_labels

    labels = kmeans_labels(T, 4, 0)
    for i, c in zip(sel.ids, sel.clusters):
        assert labels[pool.ids.index(i)] == c


def test_long_prompts_are_cut_from_the_left_for_a_proxy_tokenizer(tiny) -> None:
    """S2L's byte-level proxy can need more tokens than the target: the prompt's tail and the
    whole (short) response are kept instead of failing the example."""
    from baselines.common import scoring_model, tokenize_pool

    cfg, model_dir = tiny
    _, tok = scoring_model(_ctx(cfg, Path("."), model_dir), "t")
    pool = Pool([_ex(0, "x" * 300 + " question?\n", "yes"), _ex(1, "short?\n", "y" * 200)])
    a, b = tokenize_pool(pool, tok, 64, cut_prompt=True)
    assert len(a["input_ids"]) == 64 and len(b["input_ids"]) == 64
    assert tok.decode(a["input_ids"]).endswith(" question?\nyes<|eos|>")
    assert a["labels"][-4:] == a["input_ids"][-4:] and a["labels"][0] == -100
    assert tok.decode(b["input_ids"]).startswith("short?\n")  # short prompt kept whole
    with pytest.raises(ValueError, match="no response token"):
        tokenize_pool(pool, tok, 64)


def test_less_reads_a_validation_file_or_says_what_is_missing(tmp_path: Path) -> None:
    from baselines.common import target_examples

    def validation_pool(ctx, source, fmt, n):
        return target_examples("less", "selection.params.validation", ctx, source, fmt, n)

    rows = [{"instruction": f"Question {i}?", "input": "", "output": f"Answer {i}."} for i in range(10)]
    (tmp_path / "val.json").write_text(json.dumps(rows))
    cfg = from_dict({}, [f"data_dir={tmp_path}"])
    val = validation_pool(_ctx(cfg, tmp_path), "val.json", "alpaca", 4)
    assert len(val) == 4 and all(e.response.startswith("Answer") for e in val.examples)
    assert validation_pool(_ctx(cfg, tmp_path), "val.json", "alpaca", 4).ids == val.ids
    with pytest.raises(SelectionError, match="heldout.jsonl, which does not exist"):
        validation_pool(_ctx(cfg, tmp_path / "nowhere"), "heldout", "auto", 4)


def test_forward_stats_head_at_labelled_positions_matches_full_logits(tiny, monkeypatch) -> None:
    """The lean path (decoder, then the LM head on labelled rows in chunks) equals the plain
    full-logits forward (what repro.core.lmhead.head_chunks takes for a model whose head is not
    last: the test pretends the tiny Llama is one)."""
    import baselines.common as common
    import repro.core.lmhead as lmhead

    cfg, model_dir = tiny
    model, tok = common.scoring_model(_ctx(cfg, Path("."), model_dir), "t")
    items = common.tokenize_pool(_text_pool(10), tok, 128)
    lean = common.forward_stats(model, items, tok.pad_token_id, 4, chunk_rows=7)
    monkeypatch.setattr(lmhead, "head_is_last", lambda m: False)
    with pytest.warns(UserWarning, match="full forward"):
        full = common.forward_stats(model, items, tok.pad_token_id, 3)
    for key in ("loss", "el2n"):
        assert lean[key] == pytest.approx(full[key], rel=1e-5)
    assert (lean["tokens"] == full["tokens"]).all() and lean["tokens"].min() > 0
