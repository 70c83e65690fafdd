"""Tests for method.lora_grads: hook-based per-example LoRA gradients (exact vs a batch-1 loop,
independent of batch composition), the block-wise Rademacher projector, the Adam preconditioner,
and the end-to-end feature function. Tiny random Llama + LoRA (q_proj, v_proj), CPU, seconds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from method.lora_grads import (
    PerExampleLoraGrads,
    RademacherProjector,
    adam_preconditioner,
    lora_gradient_features,
    per_example_loss,
)
from repro.core.config.schema import ModelConfig
from repro.core.lmhead import weighted_lm_loss
from repro.core.models import load_model_and_tokenizer, materialize_model, trainable_state_dict
from repro.core.tokens import collate


@pytest.fixture(scope="module")
def lora_model():
    cfg = ModelConfig(name_or_path="tiny-random-llama")
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(materialize_model(cfg, seed=0), cfg)
    # A fresh LoRA has B = 0, so grad_A = 0: randomize B so both A and B gradients are non-zero.
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    model.eval()
    return model, tok


def _examples(lengths, seed=0):
    """Token-id examples: a prompt (labels -100) then a response; lengths are total tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(0, 256, (n,), generator=g).tolist()
        p = int(torch.randint(1, max(2, n // 2), (1,), generator=g))
        out.append({"input_ids": ids, "labels": [-100] * p + ids[p:]})
    return out


def _loop_grads(model, names, examples, pad):
    """Reference: one batch-1 backward per example of the trainer's loss (weight 1, no padding)."""
    params = dict(model.named_parameters())
    ref = {n: [] for n in names}
    for ex in examples:
        b = collate([ex], pad)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        loss = weighted_lm_loss(logits, b["labels"], torch.ones(1))
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        for n, g in zip(names, grads):
            ref[n].append(g)
    return {n: torch.stack(v) for n, v in ref.items()}


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("lengths", [[12, 7, 20, 9], [5, 64, 6, 8, 70, 4]])
def test_hooks_match_batch1_loop_on_padded_batch(lora_model, lengths):
    model, tok = lora_model
    exs = _examples(lengths)
    with PerExampleLoraGrads(model) as h:
        assert h.param_names == list(trainable_state_dict(model))  # LoRA only is trainable
        assert all(("lora_A" in n or "lora_B" in n) for n in h.param_names)
        got = h.per_example_grads(collate(exs, tok.pad_token_id))
        flat = h.flat(collate(exs, tok.pad_token_id))
    ref = _loop_grads(model, h.param_names, exs, tok.pad_token_id)
    for n in h.param_names:
        assert got[n].shape == (len(exs), *h.shapes[n])
        assert ref[n].norm() > 0, f"{n}: zero reference gradient, test would be vacuous"
        assert _rel(got[n], ref[n]) < 1e-5, n
    assert flat.shape == (len(exs), h.num_params) == (len(exs), 4096)
    ref_flat = torch.cat([ref[n].reshape(len(exs), -1) for n in h.param_names], 1)
    assert _rel(flat, ref_flat) < 1e-5
    # hooks only capture inside per_example_grads, and removing them leaves the model unhooked
    assert not any(m._forward_hooks for m in model.modules() if type(m) is torch.nn.Linear and m in h._names)


def test_batch_composition_independence(lora_model):
    model, tok = lora_model
    exs = _examples([10, 33, 6, 18, 25], seed=3)
    with PerExampleLoraGrads(model) as h:
        a = h.flat(collate(exs, tok.pad_token_id))
        b = h.flat(collate([exs[3], exs[1], exs[4]], tok.pad_token_id))
        c = h.flat(collate([exs[1]], tok.pad_token_id))
    assert _rel(b, a[[3, 1, 4]]) < 1e-5
    assert _rel(c[0], a[1]) < 1e-5


def test_per_example_loss_matches_trainer_loss():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=g)
    labels = torch.randint(0, 11, (3, 6), generator=g)
    labels[0, :3] = -100
    labels[2, :] = -100  # no response token: loss 0, not NaN
    got = per_example_loss(logits, labels)
    for b in range(2):
        want = weighted_lm_loss(logits[b : b + 1], labels[b : b + 1], torch.ones(1))
        assert torch.allclose(got[b], want)
    assert got[2] == 0


def test_projector_R_is_pm1_deterministic_and_seeded():
    P, d = 37, 20
    p = RademacherProjector(P, d, seed=5, block_rows=8)  # several blocks, a ragged last one
    R = p.project(torch.eye(P)) * d**0.5
    assert R.shape == (P, d) and set(R.unique().tolist()) == {-1.0, 1.0}
    assert torch.equal(R, torch.cat([p.block(k) for k in range(5)]))
    again = RademacherProjector(P, d, seed=5, block_rows=8).project(torch.eye(P)) * d**0.5
    assert torch.equal(R, again)
    R2 = RademacherProjector(P, d, seed=6, block_rows=8).project(torch.eye(P)) * d**0.5
    assert (R != R2).float().mean() > 0.3
    assert abs(float(R.mean())) < 0.15  # balanced signs
    with pytest.raises(ValueError):
        p.project(torch.zeros(2, P + 1))


def test_projector_jl_and_chunking():
    P, d = 20000, 2048
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, P, generator=g) * torch.rand(16, 1, generator=g)
    proj = RademacherProjector(P, d, seed=0)
    z = proj.project(x)
    rel = ((z.norm(dim=1) / x.norm(dim=1)) - 1).abs()
    assert float(rel.mean()) < 0.1
    # inner products: errors within a few sigma (sigma = |x||y|/sqrt(d)) around the true value
    gram_x, gram_z = x @ x.T, z @ z.T
    scale = torch.outer(x.norm(dim=1), x.norm(dim=1)) / d**0.5
    assert float(((gram_z - gram_x) / scale).abs().max()) < 5
    halves = torch.cat([proj.project(x[:7]), proj.project(x[7:])])
    assert torch.allclose(halves, z, rtol=1e-5, atol=1e-4)
    one = RademacherProjector(P, d, seed=0).project(x[3:4])  # a fresh projector, one row
    assert torch.allclose(one, z[3:4], rtol=1e-5, atol=1e-4)


def test_adam_preconditioner_matches_hand_computation():
    b1, b2, eps = 0.9, 0.999, 1e-8
    m_a, v_a = torch.tensor([[0.1, -0.2], [0.0, 0.3]]), torch.tensor([[0.01, 0.04], [0.0, 0.09]])
    m_b, v_b = torch.tensor([0.5]), torch.tensor([0.25])
    sd = {
        "state": {
            0: {"step": torch.tensor(3.0), "exp_avg": m_a, "exp_avg_sq": v_a},
            1: {"step": torch.tensor(3.0), "exp_avg": m_b, "exp_avg_sq": v_b},
        },
        "param_groups": [{"params": [0, 1], "betas": (b1, b2), "lr": 1e-3}],
    }
    f = adam_preconditioner(sd, ["a", "b"])
    assert f.param_order == ["a", "b"]
    g = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [-1.0, 0.0, 0.5, 0.0, -2.0]])
    m_s = torch.cat([m_a.reshape(-1), m_b])
    v_s = torch.cat([v_a.reshape(-1), v_b])
    want = torch.empty_like(g)
    t = 4  # state step 3 -> this update is the 4th
    for i in range(2):
        for j in range(5):
            m = b1 * float(m_s[j]) + (1 - b1) * float(g[i, j])
            v = b2 * float(v_s[j]) + (1 - b2) * float(g[i, j]) ** 2
            want[i, j] = (m / (1 - b1**t)) / ((v / (1 - b2**t)) ** 0.5 + eps)
    assert torch.allclose(f(g), want, rtol=1e-5)
    # name-keyed state, explicit step, step=0 = no bias correction
    f0 = adam_preconditioner({"a": sd["state"][0], "b": sd["state"][1]}, ["a", "b"], step=0)
    m = b1 * m_s + (1 - b1) * g
    v = b2 * v_s + (1 - b2) * g * g
    assert torch.allclose(f0(g), m / (v.sqrt() + eps), rtol=1e-5)
    with pytest.raises(ValueError):
        adam_preconditioner(sd, ["a"])  # must name every optimizer parameter


def test_adam_preconditioner_from_a_real_adamw_state(lora_model):
    model, tok = lora_model
    h = PerExampleLoraGrads(model)
    h.close()
    params = [p for p in model.parameters() if p.requires_grad]  # the trainer's optimizer order
    opt = torch.optim.AdamW(params, lr=0.0)  # lr 0: moments move, weights do not
    b = collate(_examples([9, 14]), tok.pad_token_id)
    weighted_lm_loss(
        model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b["labels"], torch.ones(2)
    ).backward()
    opt.step()
    opt.zero_grad()
    f = adam_preconditioner(opt.state_dict(), list(trainable_state_dict(model)))
    assert f.param_order == h.param_names
    st = opt.state[params[0]]
    g = torch.randn(2, h.num_params)
    n0 = params[0].numel()
    m = 0.9 * st["exp_avg"].reshape(-1) + 0.1 * g[:, :n0]
    v = 0.999 * st["exp_avg_sq"].reshape(-1) + 0.001 * g[:, :n0] ** 2
    want = (m / (1 - 0.9**2)) / ((v / (1 - 0.999**2)).sqrt() + 1e-8)
    assert torch.allclose(f(g)[:, :n0], want, rtol=1e-4, atol=1e-6)


def test_lora_gradient_features_order_and_batch_size(lora_model):
    model, tok = lora_model
    exs = _examples([8, 30, 5, 17, 12, 22, 6], seed=7)
    f1 = lora_gradient_features(
        model, exs, tok.pad_token_id, batch_size=1, proj_dim=64, seed=3, progress=False
    )
    f4 = lora_gradient_features(
        model, exs, tok.pad_token_id, batch_size=4, proj_dim=64, seed=3, progress=False
    )
    assert f1.shape == (7, 64) and f1.dtype == np.float32
    assert np.allclose(f1, f4, rtol=1e-4, atol=1e-6 * np.abs(f1).max())
    # input order: each row is that example's own projected gradient
    with PerExampleLoraGrads(model) as h:
        g = h.flat(collate(exs, tok.pad_token_id))
    want = RademacherProjector(h.num_params, 64, seed=3).project(g).numpy()
    assert np.allclose(f4, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
    other = lora_gradient_features(model, exs, tok.pad_token_id, 4, 64, seed=4, progress=False)
    assert not np.allclose(other, f4)
    # with a preconditioner: rows are f(g) projected
    sd = {
        n: {"exp_avg": torch.zeros(s), "exp_avg_sq": torch.full(s, 1e-6), "step": 10}
        for n, s in h.shapes.items()
    }
    pre = adam_preconditioner(sd, h.param_names)
    fp = lora_gradient_features(
        model, exs, tok.pad_token_id, 3, 64, seed=3, preconditioner=pre, progress=False
    )
    wantp = RademacherProjector(h.num_params, 64, seed=3).project(pre(g)).numpy()
    assert np.allclose(fp, wantp, rtol=1e-4, atol=1e-5 * np.abs(wantp).max())
    with pytest.raises(ValueError, match="param_order"):
        lora_gradient_features(
            model,
            exs,
            tok.pad_token_id,
            3,
            64,
            seed=3,
            preconditioner=adam_preconditioner(sd, h.param_names[::-1]),
        )
    assert not model.training  # mode restored (the fixture put it in eval)
    assert lora_gradient_features(model, [], tok.pad_token_id, 4, 64, 0).shape == (0, 64)
