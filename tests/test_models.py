"""Tests for repro.core.models: the tiny model and tokenizer, LoRA, state round-trips, the build lock,
hub errors, and (marked `smollm2`) the real SmolLM2 conversion."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from repro.core import models as M
from repro.core.config.schema import LoraConfig, ModelConfig


def _tiny_cfg(lora: bool = True, **kw) -> ModelConfig:
    return ModelConfig(name_or_path="tiny-random-llama", lora=LoraConfig(enabled=lora), **kw)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTER_REPRO_CACHE", str(tmp_path / "cache"))


def _weights(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


def test_tiny_is_deterministic_per_seed_and_differs_across_seeds(tmp_path):
    cfg = _tiny_cfg()
    rng_before = torch.random.get_rng_state()
    d1 = M.materialize_model(cfg, seed=1)
    assert torch.equal(rng_before, torch.random.get_rng_state()), "building moved the global RNG"
    assert d1.parent == tmp_path / "cache" and d1.name == "tiny-random-llama-h64-l2-s1"
    assert (d1 / ".complete").is_file() and (d1 / "config.json").is_file()
    d1b = M.materialize_model(cfg, seed=1, workdir=tmp_path / "other")  # an independent build
    d2 = M.materialize_model(cfg, seed=2)
    w1, w1b, w2 = _weights(d1), _weights(d1b), _weights(d2)
    assert w1.keys() == w1b.keys() == w2.keys()
    assert all(torch.equal(w1[k], w1b[k]) for k in w1)
    assert any(not torch.equal(w1[k], w2[k]) for k in w1 if w1[k].std() > 0)
    model, tok = M.load_model_and_tokenizer(d1, _tiny_cfg(lora=False))
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads) == (64, 2, 4)
    assert c.intermediate_size == 256 and c.max_position_embeddings == 2048
    assert c.vocab_size == len(tok) == 259
    assert next(model.parameters()).dtype == torch.float32


def test_tiny_size_follows_config():
    d = M.materialize_model(_tiny_cfg(tiny_hidden_size=32, tiny_layers=1), seed=0)
    assert d.name == "tiny-random-llama-h32-l1-s0"
    model, _ = M.load_model_and_tokenizer(d, _tiny_cfg(lora=False))
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (32, 1)
    with pytest.raises(M.ModelLoadError, match="tiny_hidden_size"):
        M.materialize_model(_tiny_cfg(tiny_hidden_size=30), seed=0)


@pytest.mark.parametrize(
    "text",
    [
        "plain ascii",
        "  leading and trailing spaces  ",
        "line one\nline two\r\n\ttabbed\n\n",
        "emoji 🙂👍🏽 and ZWJ 👨‍👩‍👧",
        "中文, العربية, Ελληνικά, naïve café",
        "code: def f(x):\n    return x**2  # ok",
        "",
    ],
)
def test_tokenizer_round_trips_utf8(text):
    _, tok = M.load_model_and_tokenizer(M.materialize_model(_tiny_cfg(), 0), _tiny_cfg(lora=False))
    ids = tok(text, add_special_tokens=True)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte, no BOS added silently
    assert tok.decode(ids) == text
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|eos|>" and tok.bos_token == "<|bos|>"
    assert tok.padding_side == "right"
    assert len({tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}) == 3


def test_forward_with_labels_gives_finite_loss():
    model, tok = M.load_model_and_tokenizer(M.materialize_model(_tiny_cfg(), 0), _tiny_cfg())
    batch = tok(["hello world", "a longer second example"], padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    out = model(**batch, labels=labels)
    assert torch.isfinite(out.loss)
    assert abs(out.loss.item() - math.log(len(tok))) < 1.0  # random init: about uniform
    out.loss.backward()


def test_lora_makes_only_lora_trainable_with_right_count():
    d = M.materialize_model(_tiny_cfg(), 0)
    cfg = _tiny_cfg()
    cfg.lora.r = 4
    model, _ = M.load_model_and_tokenizer(d, cfg)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    h, layers, r = 64, 2, 4
    # q_proj and v_proj are h x h (4 heads, no GQA); per module A is r x h and B is h x r.
    assert sum(p.numel() for p in trainable.values()) == layers * 2 * (r * h + h * r)
    assert set(M.trainable_state_dict(model)) == set(trainable)


def test_lora_init_is_deterministic_for_the_torch_seed():
    d = M.materialize_model(_tiny_cfg(), 0)
    states = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        states.append(M.trainable_state_dict(M.load_model_and_tokenizer(d, _tiny_cfg())[0]))
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert any(not torch.equal(states[0][k], states[2][k]) for k in states[0])


def _perturb(model, seed: int = 0) -> None:
    """Random values in every trainable parameter (LoRA B starts at zero, which hides bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.mark.parametrize("lora", [True, False])
def test_trainable_state_round_trip(lora):
    d = M.materialize_model(_tiny_cfg(), 0)
    src, _ = M.load_model_and_tokenizer(d, _tiny_cfg(lora))
    _perturb(src)
    state = M.trainable_state_dict(src)
    assert all(t.device.type == "cpu" for t in state.values())
    if not lora:
        assert "model.embed_tokens.weight" in state
    dst, _ = M.load_model_and_tokenizer(d, _tiny_cfg(lora))
    M.load_trainable_state_dict(dst, state)
    again = M.trainable_state_dict(dst)
    assert all(torch.equal(state[k], again[k]) for k in state)
    # The returned tensors are copies: training on must not change a saved state.
    with torch.no_grad():
        next(p for p in dst.parameters() if p.requires_grad).add_(1.0)
    assert all(torch.equal(state[k], again[k]) for k in state)

    bad = dict(state)
    name = next(iter(bad))
    bad["not.a.param"] = bad.pop(name)
    with pytest.raises(M.ModelLoadError, match="1 missing.*1 unexpected"):
        M.load_trainable_state_dict(dst, bad)


@pytest.mark.parametrize("lora", [True, False])
def test_save_and_load_finetuned_give_identical_logits(tmp_path, lora):
    d = M.materialize_model(_tiny_cfg(), 0)
    model, tok = M.load_model_and_tokenizer(d, _tiny_cfg(lora))
    _perturb(model, 1)
    model.eval()
    out = tmp_path / "final"
    M.save_finetuned(model, tok, out)
    M.save_finetuned(model, tok, out)  # overwriting an earlier result works too
    assert out.is_dir() and not [p for p in tmp_path.iterdir() if p.name.startswith(".final")]
    assert (out / "adapter_config.json").is_file() == lora
    if lora:  # the adapter only, not a copy of the base weights
        assert not (out / "model.safetensors").exists()
    loaded, tok2 = M.load_finetuned(out, d, _tiny_cfg(lora))
    assert not loaded.training
    batch = tok(["the same input", "another"], padding=True, return_tensors="pt")
    with torch.no_grad():
        a, b = model(**batch).logits, loaded(**batch).logits
    assert torch.equal(a, b)
    assert tok2.decode(tok2("π ≈ 3.14 🙂")["input_ids"]) == "π ≈ 3.14 🙂"
    with pytest.raises(M.ModelLoadError, match="model.lora.enabled"):
        M.load_finetuned(out, d, _tiny_cfg(not lora))


def test_concurrent_materialize_builds_once(tmp_path, capfd):
    cfg = _tiny_cfg()
    ctx = mp.get_context("spawn")  # what torch.multiprocessing / DDP launchers use
    with ctx.Pool(3) as pool:
        dirs = pool.starmap(M.materialize_model, [(cfg, 5)] * 3)
    assert len(set(dirs)) == 1
    cache = tmp_path / "cache"
    assert sorted(p.name for p in cache.iterdir()) == [
        ".tiny-random-llama-h64-l2-s5.lock",
        "tiny-random-llama-h64-l2-s5",
    ]
    assert (dirs[0] / ".complete").is_file()
    err = capfd.readouterr().err
    assert err.count("building tiny-random-llama") == 1, err


def test_incomplete_directory_is_rebuilt(tmp_path):
    target = tmp_path / "cache" / "tiny-random-llama-h64-l2-s3"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{half written")
    stale_tmp = tmp_path / "cache" / ".tiny-random-llama-h64-l2-s3.tmp-dead"
    stale_tmp.mkdir()
    d = M.materialize_model(_tiny_cfg(), 3)
    assert d == target and (d / ".complete").is_file() and not stale_tmp.exists()
    M.load_model_and_tokenizer(d, _tiny_cfg())


def test_local_directory_is_returned_as_is(tmp_path):
    d = M.materialize_model(_tiny_cfg(), 0)
    assert M.materialize_model(ModelConfig(name_or_path=str(d)), 0) == d
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(M.ModelLoadError, match="config.json"):
        M.materialize_model(ModelConfig(name_or_path=str(empty)), 0)
    with pytest.raises(M.ModelLoadError, match="not a directory"):
        M.materialize_model(ModelConfig(name_or_path=str(tmp_path / "missing")), 0)


def test_unknown_hub_id_offline_raises_naming_it(monkeypatch):
    import huggingface_hub.constants

    # The offline flag is read when huggingface_hub is imported; set it where it is looked up.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    name = "no-such-org/no-such-model-4c2f"
    with pytest.raises(M.ModelLoadError) as info:
        M.materialize_model(ModelConfig(name_or_path=name), 0)
    msg = str(info.value)
    assert name in msg and "local directory holding config.json" in msg
    with pytest.raises(M.ModelLoadError, match="Did you mean the builtin 'tiny-random-llama'"):
        M.materialize_model(ModelConfig(name_or_path="tiny-random-lama"), 0)


@pytest.mark.smollm2
def test_smollm2_converts_generates_and_has_full_vocab(tmp_path_factory, monkeypatch):
    shared = os.environ.get("CLUSTER_REPRO_TEST_CACHE")
    cache = Path(shared) if shared else tmp_path_factory.mktemp("smollm2-cache")
    cfg = ModelConfig(name_or_path="smollm2-135m-instruct", lora=LoraConfig(enabled=False))
    d = M.materialize_model(cfg, seed=0, workdir=cache)
    assert d == cache / "smollm2-135m-instruct" and (d / ".complete").is_file()
    assert list(d.glob("*.safetensors")) and not list(d.glob("*.gguf"))
    model, tok = M.load_model_and_tokenizer(d, cfg)
    assert model.config.vocab_size == len(tok) == 49152
    assert tok.pad_token is not None and tok.eos_token is not None
    assert not hasattr(model.config, "quantization_config")

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    enc = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
        assert out.shape[1] > enc["input_ids"].shape[1]
        print("SmolLM2 says:", repr(tok.decode(out[0, enc["input_ids"].shape[1] :])))
        # Real weights, not a random init: English is far likelier than uniform (ln 49152 = 10.8).
        text = tok("The capital of France is Paris. It is a large city in Europe.", return_tensors="pt")
        loss = model(**text, labels=text["input_ids"]).loss.item()
    assert loss < 5.0, loss
    # LoRA wraps the real model too (q_proj, v_proj at r=8: 30 layers x (576*8*2 + 8*(576+192))).
    lora_model, _ = M.load_model_and_tokenizer(d, ModelConfig(name_or_path=str(d)))
    n = sum(p.numel() for p in lora_model.parameters() if p.requires_grad)
    assert n == 30 * ((8 * 576 + 576 * 8) + (8 * 576 + 192 * 8)), n
