"""`train.strategy: fsdp` (FSDP2 over real gloo process groups on CPU, tiny model).

- One fsdp step, with rank weights and gradient accumulation, equals the serial weighted update
  sum_k (w_k / K) * grad_k at world sizes 2 and 4, for full fine-tuning and for LoRA (the DDP
  step is held to the same reference in test_trainer.py).
- With the recipe's optimizer (Adafactor, repro/core/optim.py) and activation checkpointing, fsdp
  reaches the DDP run's weights, and each rank holds 1/world_size of DDP's parameter + gradient
  + optimizer bytes.
- A killed fsdp run resumes from its sharded checkpoint to the uninterrupted run's weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from repro.core.config.load import from_dict
from repro.core.io import read_json
from repro.core.rundir import model_dir_of
from repro.core.types import Schedule
from repro.pipeline import load_pool_files, run_experiment
from tests.conftest import rewrite_stage_files
from tests.crash_hook import STEP_VAR, crash_env

TINY = [
    "model.name_or_path=tiny-random-llama",
    "data.sources=[{path: demo, params: {train_size: 48, heldout_per_category: 1}}]",
    "data.max_length=256",
    "eval.benchmarks=[]",
    "eval.heldout_loss=false",
]


def _cfg(out: Path, *extra: str):
    return from_dict({}, [f"output_dir={out}", "name=t", *TINY, *extra])


def _trained(run_dir: Path, cfg) -> dict[str, torch.Tensor]:
    """The saved model's trainable parameters (the adapter for LoRA, every weight otherwise)."""
    from repro.core.models import load_finetuned

    model, _ = load_finetuned(run_dir / "model", model_dir_of(run_dir), cfg.model)
    names = {n for n, p in model.named_parameters() if "lora_" in n or not cfg.model.lora.enabled}
    return {n: p.detach() for n, p in model.named_parameters() if n in names}


def _serial_update(
    run_dir: Path, cfg, weights: list[float], lr: float
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(initial, expected) trainable weights after one plain-SGD step on sum_k (w_k/K) grad_k,
    computed in this process worker by worker, micro-batch by micro-batch."""
    from repro.core.lmhead import weighted_lm_loss
    from repro.core.models import load_model_and_tokenizer
    from repro.core.runtime import seed_everything
    from repro.core.tokens import TokenizedPool, collate

    K, b = cfg.world_size, cfg.train.per_device_batch_size
    accum = cfg.train.global_batch_size // (b * K)
    sched = Schedule.from_dict(read_json(run_dir / "schedule.json"))
    seed_everything(cfg.seed)
    model, tok = load_model_and_tokenizer(model_dir_of(run_dir), cfg.model)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    init = {n: p.detach().clone() for n, p in params.items()}
    pool, _ = load_pool_files(run_dir)
    tp = TokenizedPool(pool, tok, cfg.data.max_length)
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for k in range(K):
        model.zero_grad()
        for m in range(accum):
            ids = sched.order[0][k][m * b : (m + 1) * b]
            batch = collate([tp[i] for i in ids], tok.pad_token_id)
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            (weighted_lm_loss(logits, batch["labels"], torch.full((b,), weights[k])) / accum).backward()
        for n, p in params.items():
            total[n] += p.grad / K
    return init, {n: init[n] - lr * total[n] for n in params}


@pytest.mark.parametrize(
    "world_size,lora",
    [(2, False), (4, True), (4, False), (2, True)],
    ids=["ws2-full", "ws4-lora", "ws4-full", "ws2-lora-checkpointing"],
)
def test_fsdp_step_equals_serial_weighted_update(tmp_path: Path, world_size: int, lora: bool) -> None:
    """(ws2-lora also recomputes its layers: activation checkpointing changes no gradient.)"""
    lr = 0.5
    ckpt = str(world_size == 2 and lora).lower()
    weights = [0.4, 1.0, 1.6, 2.2][:world_size]
    cfg = _cfg(
        tmp_path,
        f"world_size={world_size}",
        "train.strategy=fsdp",
        "train.optimizer=sgd",
        f"train.lr={lr}",
        "train.per_device_batch_size=1",
        f"train.global_batch_size={2 * world_size}",  # 2 accumulation steps
        "train.max_steps=1",
        "train.schedule=constant",
        f"model.lora.enabled={str(lora).lower()}",
        f"train.activation_checkpointing={ckpt}",
    )
    run_dir = run_experiment(cfg, until="schedule")
    sched = Schedule.from_dict(read_json(run_dir / "schedule.json"))
    sched.worker_weights = weights
    rewrite_stage_files(run_dir, "schedule", {"schedule.json": sched.to_dict()})
    run_experiment(cfg, until="train")

    init, expected = _serial_update(run_dir, cfg, weights, lr)
    trained = _trained(run_dir, cfg)
    assert set(trained) == set(expected)
    moved = 0.0
    for n in expected:
        torch.testing.assert_close(trained[n], expected[n], rtol=1e-5, atol=1e-7)
        moved += float((trained[n] - init[n]).abs().sum())
    assert moved > 1e-4  # the step changed the weights

    info = read_json(run_dir / "train.json")
    assert info["strategy"] == "fsdp" and info["allreduce_wait_share"] is None
    # Full fine-tuning: every rank holds about 1/K of the parameters and gradients.
    if not lora:
        n_bytes = sum(p.numel() * 4 for p in init.values())
        for w in info["per_worker"]:
            assert w["state_bytes"]["params"] == pytest.approx(n_bytes / world_size, rel=0.05)
            assert w["state_bytes"]["grads"] == pytest.approx(n_bytes / world_size, rel=0.05)


RECIPE_LIKE = [
    "world_size=2",
    "train.optimizer=adafactor",
    "train.lr=1e-2",
    "train.per_device_batch_size=2",
    "train.global_batch_size=4",
    "train.epochs=1",
    "train.max_steps=6",
    "train.checkpoint_every=3",
    "model.lora.enabled=false",
]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """The recipe's way, small: fsdp + activation checkpointing + Adafactor, full fine-tuning."""
    cfg = _cfg(
        tmp_path_factory.mktemp("fsdp"),
        *RECIPE_LIKE,
        "train.strategy=fsdp",
        "train.activation_checkpointing=true",
    )
    return run_experiment(cfg, until="results"), cfg  # through every stage, results included


def test_fsdp_with_checkpointing_reaches_the_ddp_weights_on_a_shard_of_the_memory(
    tmp_path: Path, fsdp_run: tuple[Path, object]
) -> None:
    fsdp_dir, cfg = fsdp_run
    ddp_cfg = _cfg(tmp_path, *RECIPE_LIKE, "train.strategy=ddp")
    ddp_dir = run_experiment(ddp_cfg, until="train")
    a, b = _trained(ddp_dir, ddp_cfg), _trained(fsdp_dir, cfg)
    assert set(a) == set(b) and len(a) > 10
    for n in a:
        torch.testing.assert_close(b[n], a[n], rtol=1e-5, atol=1e-6)

    def model_state(info: dict) -> list[int]:
        return [
            w["state_bytes"]["params"] + w["state_bytes"]["grads"] + w["state_bytes"]["optimizer"]
            for w in info["per_worker"]
        ]

    ddp_info, fsdp_info = read_json(ddp_dir / "train.json"), read_json(fsdp_dir / "train.json")
    ddp_bytes = model_state(ddp_info)
    assert ddp_info["per_worker"][0]["state_bytes"]["optimizer"] > 0  # Adafactor's statistics
    for got in model_state(fsdp_info):
        assert got == pytest.approx(ddp_bytes[0] / 2, rel=0.05)
    assert fsdp_info["activation_checkpointing"] is True
    # The results stage writes the run's rows; the all-reduce wait is absent (not measured), not 0.
    import csv

    rows = list(csv.DictReader((fsdp_dir / "results.part.csv").open()))
    assert rows and all(r["allreduce_wait_share"] == "" for r in rows)
    assert not any(r["metric"] == "allreduce_wait_s" for r in rows)
    assert [r["value"] for r in rows if (r["benchmark"], r["metric"]) == ("cost/train", "fsdp")] == ["1"]


def test_killed_fsdp_run_resumes_to_the_same_weights(
    tmp_path: Path, fsdp_run: tuple[Path, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    full_dir, cfg = fsdp_run
    cfg_b = _cfg(tmp_path, *RECIPE_LIKE, "train.strategy=fsdp", "train.activation_checkpointing=true")
    for k, v in crash_env(5).items():  # every spawned worker dies after step 5 (tests/crash_hook)
        monkeypatch.setenv(k, v)
    with pytest.raises(Exception):  # noqa: B017 - whatever the killed workers make the parent raise
        run_experiment(cfg_b, until="train")
    run_b = cfg_b.run_dir()
    assert not (run_b / "train.json").exists()
    ckpts = sorted((run_b / "checkpoints").glob("step-*"))
    assert [p.name for p in ckpts] == ["step-0000003"]
    assert (ckpts[0] / "dcp" / ".metadata").is_file()  # sharded: torch.distributed.checkpoint
    monkeypatch.delenv(STEP_VAR)
    run_experiment(cfg_b, until="train")
    info = read_json(run_b / "train.json")
    assert info["resumed_from_step"] == 3 and info["steps_run"] == 3
    a, b = _trained(full_dir, cfg), _trained(run_b, cfg_b)
    for n in a:
        assert torch.equal(a[n], b[n]), n
