"""CluSTER step 1, the gradient proxy feature (method/features.py), on the tiny random Llama.

- the efficient form equals the naive (authors') form, with padding, uneven responses, chunking;
- both equal an independent autograd check: the gold-token row of d(-log p_t(y_t))/d(W_head),
  position by position, averaged (a shift-by-one variant is shown to differ, so the check bites);
- an example with no response token is an error naming its row; batch position/size do not matter;
- the .npy file is bit-identical whether 1, 2 or 4 gloo processes compute it (global batches dealt
  whole), also inside an existing torchrun/SLURM-style group larger than the workers asked for;
- how many processes the pass runs by default: K on CPU, min(K, GPUs) on GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from method.features import (
    compute_features,
    feature_workers,
    features_to_file,
    gradient_proxy_features,
    gradient_proxy_features_naive,
)
from repro.core.config.schema import LoraConfig, ModelConfig
from repro.core.io import atomic_write_jsonl
from repro.core.lmhead import HeadWorkspace
from repro.core.tokens import IGNORE_INDEX, collate, tokenize_example
from repro.core.types import Example

CFG = ModelConfig(name_or_path="tiny-random-llama", lora=LoraConfig(enabled=False))


def _examples(n: int) -> list[Example]:
    """Varied prompt and response lengths (the tokenizer is byte-level: 1 token per byte)."""
    out = []
    for i in range(n):
        prompt = f"### Instruction:\nTask {i}: " + "say something " * (i % 5) + "\n### Response:\n"
        response = "ok " * (1 + (7 * i) % 11) + str(i)
        out.append(Example(id=f"ex-{i:03d}", prompt=prompt, response=response, source="t"))
    return out


@pytest.fixture(scope="module")
def tiny():
    from repro.core.models import load_model_and_tokenizer, materialize_model

    model_dir = materialize_model(CFG, seed=0)
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(model_dir, CFG)
    return model_dir, model.eval(), tok


def _batch(tok, exs: list[Example], max_length: int = 256) -> dict:
    return collate([tokenize_example(e, tok, max_length) for e in exs], tok.pad_token_id)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_efficient_equals_naive_with_padding_and_chunks(tiny) -> None:
    _, model, tok = tiny
    exs = _examples(6)
    batch = _batch(tok, exs)
    n_resp = (batch["labels"][:, 1:] != IGNORE_INDEX).sum(1)
    assert len(set(n_resp.tolist())) > 2 and (batch["attention_mask"] == 0).any()  # really uneven
    naive = gradient_proxy_features_naive(model, batch)
    assert naive.shape == (6, model.config.hidden_size) and naive.dtype == torch.float32
    _close(gradient_proxy_features(model, batch), naive)
    _close(gradient_proxy_features(model, batch, chunk_rows=3), naive)  # chunks split examples
    # Truncation at max_length keeps the response's first tokens and drops the eos: still equal.
    full = [tokenize_example(e, tok, 256) for e in exs]
    cut = max(len(f["input_ids"]) - f["n_response_tokens"] for f in full) + 2
    assert any(len(f["input_ids"]) > cut for f in full)
    short = _batch(tok, exs, max_length=cut)
    _close(gradient_proxy_features(model, short, chunk_rows=5), gradient_proxy_features_naive(model, short))


def test_a_model_whose_head_is_not_last_is_scored_by_its_full_forward(tiny, monkeypatch) -> None:
    """Gemma-2 and Cohere transform logits after the LM head (repro.core.lmhead.head_is_last):
    the shared scoring pass then takes the model's own full-forward logits, in chunks, and says
    so. The tiny Llama's head is last; the test pretends otherwise (no such tiny model here)."""
    import repro.core.lmhead as lmhead

    _, model, tok = tiny
    batch = _batch(tok, _examples(5))
    assert lmhead.head_is_last(model)
    monkeypatch.setattr(lmhead, "head_is_last", lambda m: False)
    with pytest.warns(UserWarning, match="transforms logits after the LM head"):
        got = gradient_proxy_features(model, batch, chunk_rows=4)
    _close(got, gradient_proxy_features_naive(model, batch))


def test_workspace_reused_across_batches_equals_naive(tiny) -> None:
    """One HeadWorkspace over batches of growing then shrinking response counts (the buffer is
    reallocated to grow, then viewed smaller) gives the naive form's features every time."""
    _, model, tok = tiny
    ws = HeadWorkspace()
    exs = _examples(6)
    for part in (exs[:2], exs, exs[3:], exs[:1]):
        batch = _batch(tok, part)
        _close(
            gradient_proxy_features(model, batch, chunk_rows=4, workspace=ws),
            gradient_proxy_features_naive(model, batch),
        )
    assert ws._buf is not None and ws._buf.shape[0] == 4  # never beyond chunk_rows


def test_columns_after_the_last_response_position_change_nothing(tiny) -> None:
    """The body stops at the last response column: extra trailing padding, or junk tokens in
    columns no label looks at, leave the features unchanged (causal attention)."""
    _, model, tok = tiny
    batch = _batch(tok, _examples(3))
    ref = gradient_proxy_features(model, batch)
    extra = 7
    fills = {"input_ids": 5, "attention_mask": 1, "labels": IGNORE_INDEX}
    junk = {
        k: torch.cat([v, torch.full((v.shape[0], extra), fills[k], dtype=v.dtype)], dim=1)
        for k, v in batch.items()
    }
    _close(gradient_proxy_features(model, junk), ref)
    _close(gradient_proxy_features_naive(model, junk), ref)


def test_feature_is_the_gold_row_of_the_head_gradient(tiny) -> None:
    """g = (1/|R|) sum_t [d(-log p_t(y_t)) / d W_head][y_t], by autograd, one position at a time."""
    _, model, tok = tiny
    ex = Example(id="one", prompt="Q: add 2 and 3\nA: ", response="five, 5", source="t")
    b = _batch(tok, [ex])
    head = model.get_output_embeddings().weight
    was = head.requires_grad
    head.requires_grad_(True)
    try:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[0]
        labels = b["labels"][0]
        rows, shifted = [], []
        for t in range(labels.numel() - 1):
            if labels[t + 1] == IGNORE_INDEX:
                continue
            y = int(labels[t + 1])
            loss = -torch.log_softmax(logits[t], dim=-1)[y]
            (grad,) = torch.autograd.grad(loss, head, retain_graph=True)
            rows.append(grad[y])
            # The same with the label misaligned by one: what a wrong shift would compute.
            y_wrong = int(labels[t]) if labels[t] != IGNORE_INDEX else 0
            (g2,) = torch.autograd.grad(-torch.log_softmax(logits[t], -1)[y_wrong], head, retain_graph=True)
            shifted.append(g2[y_wrong])
    finally:
        head.requires_grad_(was)
    assert len(rows) == len(tok(ex.response, add_special_tokens=False)["input_ids"]) + 1  # + eos
    expected = torch.stack(rows).mean(0)[None]
    _close(gradient_proxy_features(model, b), expected)
    _close(gradient_proxy_features_naive(model, b), expected)
    assert not torch.allclose(torch.stack(shifted).mean(0)[None], expected, rtol=1e-3)


def test_no_response_token_is_an_error_naming_the_row(tiny) -> None:
    _, model, tok = tiny
    batch = _batch(tok, _examples(3))
    batch["labels"][1] = IGNORE_INDEX
    for fn in (gradient_proxy_features, gradient_proxy_features_naive):
        with pytest.raises(ValueError, match="batch row 1 "):
            fn(model, batch)
    # Only the first label is a response token: it has no predecessor, so R is empty too.
    batch = _batch(tok, _examples(2))
    batch["labels"][0] = IGNORE_INDEX
    batch["labels"][0, 0] = 65
    with pytest.raises(ValueError, match="batch row 0 "):
        gradient_proxy_features(model, batch)


def test_batch_position_and_size_do_not_matter(tiny) -> None:
    _, model, tok = tiny
    exs = _examples(7)
    target = exs[2]
    alone = gradient_proxy_features(model, _batch(tok, [target]))[0]
    for batch_exs, pos in (([target, exs[0], exs[5]], 0), ([exs[4], exs[6], exs[1], target], 3)):
        _close(gradient_proxy_features(model, _batch(tok, batch_exs))[pos], alone)
    # compute_features sorts by length inside, but returns input order, for any batch size.
    ref = torch.cat([gradient_proxy_features(model, _batch(tok, [e])) for e in exs]).numpy()
    for bs in (1, 3, 7):
        got = compute_features(exs, tok, model, 256, bs, progress=False)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    out = np.zeros((10, ref.shape[1]), dtype=np.float32)
    compute_features(exs, tok, model, 256, 2, out=out, rows=list(range(9, 2, -1)), progress=False)
    np.testing.assert_allclose(out[9:2:-1], ref, rtol=1e-5, atol=1e-6)
    assert not out[:3].any()


def _torchrun_like_rank(
    rank: int, world: int, ports: tuple[int, int], run_dir: str, model_dir: str, out_dir: str
) -> None:
    """One process of a group that already exists, as under torchrun or SLURM: its rank comes from
    environment variables, which features_to_file joins (repro.core.distributed.env_rank_world). The
    same 4 processes run the pass twice: all 4 compute, then 2 (ranks 2 and 3 only gather)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    torch.set_num_threads(1)  # as the one-process run in the test (see there)
    for workers, port in zip((4, 2), ports):
        os.environ["MASTER_PORT"] = str(port)
        features_to_file(
            Path(run_dir), workers, Path(model_dir), CFG, 256, 2, Path(out_dir) / f"x{workers}.npy"
        )


def test_features_are_bit_identical_from_1_2_and_4_processes(tiny, tmp_path: Path) -> None:
    """The pool's length-sorted batches are formed globally and dealt whole to the processes, so
    each example is computed in the same batch (same padding) whatever the process count, and the
    files are equal bit for bit. Every process runs one thread: a different thread count may change
    the order of a matmul's float reductions on some machines (not here, but CI machines differ).
    Before (rows r, r+K, ... batched per worker) 2 or 4 processes differed from 1 by up to 2e-7."""
    import torch.multiprocessing as mp

    from repro.core.distributed import _ready_fork_server, free_port

    model_dir, model, tok = tiny
    exs = _examples(18)  # 9 batches of 2: dealt 5+4 to 2 workers, 3+2+2+2 to 4
    run_dir = tmp_path / "run"
    atomic_write_jsonl(run_dir / "pool.jsonl", [e.to_dict() for e in exs])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = np.load(features_to_file(run_dir, 1, model_dir, CFG, 256, 2, tmp_path / "x1.npy"))
        direct = compute_features(exs, tok, model, 256, 2, progress=False)  # pool order
    finally:
        torch.set_num_threads(threads)
    ports = (free_port(), free_port())
    while ports[1] == ports[0]:
        ports = (ports[0], free_port())
    # Forked from the launcher's fork server (torch and transformers imported once), as the
    # trainer's workers are: 4 spawned processes would import them 4 times (~8 CPU-s each).
    assert _ready_fork_server()
    mp.start_processes(
        _torchrun_like_rank,
        args=(4, ports, str(run_dir), str(model_dir), str(tmp_path)),
        nprocs=4,
        start_method="forkserver",
    )
    four, two = np.load(tmp_path / "x4.npy"), np.load(tmp_path / "x2.npy")
    assert one.shape == (18, model.config.hidden_size) and one.dtype == np.float32
    assert np.array_equal(one, direct)
    assert np.array_equal(four, one) and np.array_equal(two, one)
    # a different batch size does change the last bits, so equality above is not a given
    assert not np.array_equal(compute_features(exs, tok, model, 256, 3, progress=False), one)

    metas = {w: json.loads((tmp_path / f"x{w}.json").read_text()) for w in (1, 2, 4)}
    assert [(m["workers"], m["world_size"], m["n"], m["batches"]) for m in metas.values()] == [
        (1, 1, 18, 9),
        (2, 4, 18, 9),
        (4, 4, 18, 9),
    ]
    per = {w: [(p["rank"], p["batches"], p["rows"]) for p in m["per_worker"]] for w, m in metas.items()}
    assert per[2] == [(0, 5, 10), (1, 4, 8), (2, 0, 0), (3, 0, 0)]  # ranks 2, 3 only gathered
    assert per[4] == [(0, 3, 6), (1, 2, 4), (2, 2, 4), (3, 2, 4)]
    assert metas[4]["seconds"] > 0 and metas[4]["peak_mem_mb"] > 0 and metas[4]["wall_s"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run",
        "x1.json",
        "x1.npy",
        "x2.json",
        "x2.npy",
        "x4.json",
        "x4.npy",
    ]  # no temp files


def test_how_many_feature_processes() -> None:
    """K on CPU (today's behaviour), min(K, GPUs) on GPU (NCCL: one process per GPU), or the
    requested number. The GPU count is passed in: this machine has none."""
    assert feature_workers(4, gpus=0) == 4
    assert [feature_workers(4, gpus=g) for g in (1, 2, 4, 8)] == [1, 2, 4, 4]
    assert feature_workers(4, requested=2, gpus=0) == 2
    assert feature_workers(8, requested=3, gpus=4) == 3
    assert feature_workers(4) == (min(4, torch.cuda.device_count()) if torch.cuda.is_available() else 4)
    with pytest.raises(ValueError, match="world size"):
        feature_workers(0)
