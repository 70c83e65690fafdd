"""Tests for evals.heldout's generation: stopping at the first line changes no exact-match score."""

from __future__ import annotations

import torch

from evals.heldout import FirstLineDone, generate
from repro.core import models as M
from repro.core.config.schema import LoraConfig, ModelConfig


def test_first_line_rule_marks_only_sequences_with_a_finished_line():
    class Tok:
        def batch_decode(self, ids, skip_special_tokens=True):
            return ["".join(chr(int(t)) for t in row) for row in ids]

    rows = ["xx" + s for s in ("\n\n", "ab", "ab\n", " \nab")]  # prompt "xx", then new text
    width = max(map(len, rows))
    ids = torch.tensor([[ord(c) for c in r.ljust(width, " ")] for r in rows])
    done = FirstLineDone(Tok(), prompt_len=2)(ids, None)
    # leading blank lines do not count; a newline after content does
    assert done.tolist() == [False, False, True, False]


def test_first_line_generation_equals_first_line_of_full_generation():
    cfg = ModelConfig(name_or_path="tiny-random-llama", lora=LoraConfig(enabled=False))
    model, tok = M.load_model_and_tokenizer(M.materialize_model(cfg, seed=3), cfg)
    # A random model rarely emits a newline; scale its newline logit row so some lines end early.
    with torch.no_grad():
        model.lm_head.weight[tok("\n", add_special_tokens=False)["input_ids"][-1]] *= 5
    prompts = [f"Q{i}: what is {i} + {i}?\nA:" for i in range(6)]
    full = generate(model, tok, prompts, max_new_tokens=40, batch_size=3)
    short = generate(model, tok, prompts, max_new_tokens=40, batch_size=3, first_line_only=True)

    def first_line(t: str) -> str:
        return t.strip().split("\n", 1)[0]

    assert [first_line(s) for s in short] == [first_line(f) for f in full]
    # a stopped sequence ends at its first line: nothing but padding after it
    assert all(len(s) <= len(f) for s, f in zip(short, full))
    assert any(len(s) < len(f) for s, f in zip(short, full)), "the rule never stopped anything"


def test_heldout_loss_per_category_is_the_loss_of_that_category_alone():
    """by_category[c] equals heldout_loss over c's examples only, and the categories' token-
    weighted losses make up the pooled loss."""
    import math

    from evals.heldout import heldout_loss
    from repro.core.config.load import load_config
    from repro.core.data import load_pool
    from repro.core.types import Pool
    from tests.conftest import CONFIGS

    cfg = load_config(CONFIGS / "demo-quick.yaml", ["data.sources[0].params.train_size=24"])
    mcfg = ModelConfig(name_or_path="tiny-random-llama", lora=LoraConfig(enabled=False))
    model, tok = M.load_model_and_tokenizer(M.materialize_model(mcfg, seed=3), mcfg)
    _, held = load_pool(cfg)
    out = heldout_loss(model, tok, held, 256, batch_size=5)  # batches mix categories
    cats = sorted({e.category for e in held.examples})
    assert sorted(out["by_category"]) == cats and len(cats) == 12
    for c in cats:
        alone = heldout_loss(model, tok, Pool([e for e in held.examples if e.category == c]), 256, 5)
        got = out["by_category"][c]
        assert got["n"] == alone["n"] == 2 and got["tokens"] == alone["tokens"]
        assert math.isclose(got["loss"], alone["loss"], rel_tol=1e-4)
    tokens = sum(v["tokens"] for v in out["by_category"].values())
    pooled = sum(v["loss"] * v["tokens"] for v in out["by_category"].values()) / tokens
    assert tokens == out["tokens"] and math.isclose(pooled, out["loss"], rel_tol=1e-5)
