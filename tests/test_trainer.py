"""The data-parallel trainer, through real 4-process gloo DDP on the tiny model.

- Weighting: with worker weights w_k, one DDP step equals the serial update with gradient
  sum_k (w_k / K) * grad_k (plain SGD, so the update is the gradient itself).
- Resume: a run killed after a checkpoint and resumed ends with the same weights as an
  uninterrupted one. The kill is every worker calling os._exit(137) once a given number of steps
  is done (tests/crash_hook, put on PYTHONPATH: no hook in the trainer), i.e. an abrupt death with
  no cleanup, at a known step. Its
  result rows say attempts 2, resumed from step 3, and train_s counts the killed attempt's loop
  up to its checkpoint too; its TensorBoard events (train.report_to) hold every step once.
- Bit for bit at 4 and 8 DDP workers and 4 fsdp workers, where the order of floating-point
  additions in the all-reduce matters (trainer.settle_ddp_buckets).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from repro.core.config.load import from_dict, load_config
from repro.core.io import read_json
from repro.core.results import PART_NAME, read_rows
from repro.core.rundir import model_dir_of, stage_marker
from repro.core.types import Schedule
from repro.pipeline import load_pool_files, run_experiment
from tests.conftest import CONFIGS, REPO, rewrite_stage_files
from tests.crash_hook import crash_env
from tests.test_tracking import tb_scalars


def _tiny_cfg(tmp_path: Path, *extra: str):
    return from_dict(
        {},
        [
            f"output_dir={tmp_path}",
            "name=t",
            "model.name_or_path=tiny-random-llama",
            "data.sources=[{path: demo, params: {train_size: 48, heldout_per_category: 1}}]",
            "data.max_length=256",
            "eval.benchmarks=[]",
            *extra,
        ],
    )


def _trainable(run_dir: Path, cfg) -> dict[str, torch.Tensor]:
    from repro.core.models import load_finetuned

    model_dir = model_dir_of(run_dir)
    model, _ = load_finetuned(run_dir / "model", model_dir, cfg.model)
    return {k: v for k, v in model.named_parameters() if "lora_" in k}


@pytest.mark.parametrize("per_device", [2, 1], ids=["batch2-accum1", "batch1-accum2-checkpointing"])
def test_weighted_ddp_step_equals_serial_weighted_update(tmp_path: Path, per_device: int) -> None:
    """(batch1-accum2 also recomputes its layers: activation checkpointing changes no gradient.)"""
    from repro.core.lmhead import weighted_lm_loss
    from repro.core.models import load_model_and_tokenizer
    from repro.core.runtime import seed_everything
    from repro.core.tokens import TokenizedPool, collate

    K, lr, global_batch = 4, 0.5, 8
    accum = global_batch // (per_device * K)
    weights = [0.4, 1.0, 1.6, 2.2]
    cfg = _tiny_cfg(
        tmp_path,
        f"world_size={K}",
        "train.optimizer=sgd",
        f"train.lr={lr}",
        f"train.per_device_batch_size={per_device}",
        f"train.global_batch_size={global_batch}",
        "train.max_steps=1",
        "train.schedule=constant",
        "eval.heldout_loss=false",
        f"train.activation_checkpointing={str(per_device == 1).lower()}",
    )
    run_dir = run_experiment(cfg, until="schedule")
    sched = Schedule.from_dict(read_json(run_dir / "schedule.json"))
    sched.worker_weights = weights
    rewrite_stage_files(run_dir, "schedule", {"schedule.json": sched.to_dict()})
    run_experiment(cfg, until="train")

    # The serial reference, in this process, from the same initial weights.
    model_dir = model_dir_of(run_dir)
    seed_everything(cfg.seed)
    model, tok = load_model_and_tokenizer(model_dir, cfg.model)
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    init = {k: p.detach().clone() for k, p in params.items()}
    pool, _ = load_pool_files(run_dir)
    tp = TokenizedPool(pool, tok, cfg.data.max_length)
    per_worker = []  # grad_k with unit weight: the loss is linear in the weight
    for k in range(K):
        model.zero_grad()
        for m in range(accum):  # micro-batches, each a token mean, averaged over accumulation
            ids = sched.order[0][k][m * per_device : (m + 1) * per_device]
            b = collate([tp[i] for i in ids], tok.pad_token_id)
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            (weighted_lm_loss(logits, b["labels"], torch.ones(per_device)) / accum).backward()
        per_worker.append({n: p.grad.detach().clone() for n, p in params.items()})
    trained = _trainable(run_dir, cfg)
    assert set(trained) == set(params)
    far_from_unweighted = 0.0
    for name in params:
        weighted = sum(weights[k] / K * per_worker[k][name] for k in range(K))
        plain = sum(per_worker[k][name] / K for k in range(K))
        torch.testing.assert_close(trained[name], init[name] - lr * weighted, rtol=1e-5, atol=1e-7)
        far_from_unweighted += float((trained[name] - (init[name] - lr * plain)).abs().sum())
    assert far_from_unweighted > 1e-4  # the weights changed the update

    log = [json.loads(line) for line in (run_dir / "train_log" / "rank0.jsonl").read_text().splitlines()]
    assert len(log) == 1 and log[0]["tokens"] > 0 and log[0]["allreduce_wait_s"] >= 0


def test_balanced_steps_run_in_lockstep_with_the_per_example_objective(tmp_path: Path) -> None:
    """A schedule balanced in tokens (Schedule.step_sizes): worker 0 takes 3 examples in the
    step, worker 1 takes 5, both in accumulation 2 micro-batches (2 + 1 and 3 + 2), under real
    2-process gloo DDP with no_sync on the first micro-step. The SGD step must equal
    -lr * sum_k (w_k / K) * (1 / m_k) * sum_i g_i, with g_i the gradient of example i's own token
    mean (computed one example at a time here) and m_k worker k's mean examples per step; and
    each worker's logged tokens are the step's token sum that the schedule stage predicts."""
    from repro.core import steps
    from repro.core.lmhead import weighted_lm_loss
    from repro.core.models import load_model_and_tokenizer
    from repro.core.runtime import seed_everything
    from repro.core.steps import derive
    from repro.core.tokens import TokenizedPool, collate

    K, lr, weights = 2, 0.5, [0.7, 1.3]
    cfg = _tiny_cfg(
        tmp_path,
        f"world_size={K}",
        "train.optimizer=sgd",
        f"train.lr={lr}",
        "train.per_device_batch_size=1",
        "train.global_batch_size=4",
        "train.max_steps=1",
        "train.schedule=constant",
        "eval.heldout_loss=false",
    )
    run_dir = run_experiment(cfg, until="schedule")
    pool, _ = load_pool_files(run_dir)
    ids = pool.ids
    sched = Schedule(order=[[ids[0:6], ids[6:16]]], worker_weights=weights, step_sizes=[[[3, 3], [5, 5]]])
    derived = derive(cfg, len(ids), 16, sched.per_worker_len(), sched.steps_per_epoch())
    assert (derived.grad_accum, derived.steps_per_epoch, derived.total_steps) == (2, 2, 1)
    rewrite_stage_files(
        run_dir, "schedule", {"schedule.json": sched.to_dict(), "derived.json": derived.to_dict()}
    )
    run_experiment(cfg, until="train")

    model_dir = model_dir_of(run_dir)
    seed_everything(cfg.seed)
    model, tok = load_model_and_tokenizer(model_dir, cfg.model)
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    init = {k: p.detach().clone() for k, p in params.items()}
    tp = TokenizedPool(pool, tok, cfg.data.max_length)
    per_example = {}  # example id -> gradient of its own token-mean loss
    for i in ids[0:3] + ids[6:11]:
        model.zero_grad()
        b = collate([tp[i]], tok.pad_token_id)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        weighted_lm_loss(logits, b["labels"], torch.ones(1)).backward()
        per_example[i] = {n: p.grad.detach().clone() for n, p in params.items()}
    step = {0: ids[0:3], 1: ids[6:11]}
    mean_per_step = {0: 3.0, 1: 5.0}
    trained = _trainable(run_dir, cfg)
    off_by_token_mean = 0.0
    for name in params:
        grad = sum(
            weights[k] / K / mean_per_step[k] * per_example[i][name] for k in range(K) for i in step[k]
        )
        torch.testing.assert_close(trained[name], init[name] - lr * grad, rtol=1e-5, atol=1e-7)
        # The normalization matters: dividing by accumulation instead gives another update.
        other = sum(weights[k] / K / 2 * per_example[i][name] for k in range(K) for i in step[k])
        off_by_token_mean += float((trained[name] - (init[name] - lr * other)).abs().sum())
    assert off_by_token_mean > 1e-4

    lengths = {i: len(tp[i]["input_ids"]) for i in ids[:16]}
    predicted = steps.step_token_sums(sched, lengths, 2, 2, 1)
    for k in range(K):
        (row,) = [
            json.loads(line) for line in (run_dir / "train_log" / f"rank{k}.jsonl").read_text().splitlines()
        ]
        assert row["tokens"] == predicted[0, k] == sum(lengths[i] for i in step[k])


def _run_cli(args: list[str], env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "repro", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def test_killed_run_resumes_to_the_same_weights(tmp_path: Path) -> None:
    common = [
        "model.name_or_path=tiny-random-llama",
        "data.sources=[{path: demo, params: {train_size: 64, heldout_per_category: 1}}]",
        "world_size=2",
        "train.per_device_batch_size=2",
        "train.global_batch_size=4",
        "train.epochs=1",
        "train.checkpoint_every=3",
        "eval.benchmarks=[]",
        "data.max_length=256",
        "train.report_to=tensorboard",
    ]
    cfg_path = CONFIGS / "demo-quick.yaml"
    # The uninterrupted reference runs in this process (its workers forked from this process's
    # fork server): a third CLI process would import torch and transformers once more.
    run_a = run_experiment(load_config(cfg_path, [f"output_dir={tmp_path / 'a'}", *common]))

    b_out = tmp_path / "b"
    crashed = _run_cli(["run", str(cfg_path), f"output_dir={b_out}", *common], crash_env(5))
    assert crashed.returncode != 0
    run_b = next(b_out.glob("*/*"))
    assert not (run_b / "train.json").exists()
    assert sorted(p.name for p in (run_b / "checkpoints").glob("step-*")) == ["step-0000003"]
    resumed = _run_cli(["run", str(cfg_path), f"output_dir={b_out}", *common])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    info = read_json(run_b / "train.json")
    assert info["resumed_from_step"] == 3 and info["steps_run"] == info["total_steps"] - 3
    # Stages finished before the kill were not redone.
    assert "select: done already" in resumed.stderr

    assert run_a.name == run_b.name  # same config hash
    cfg = from_dict({}, common)
    wa, wb = _trainable(run_a, cfg), _trainable(run_b, cfg)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    # The per-rank log holds each step exactly once after the resume.
    steps = [json.loads(ln)["step"] for ln in (run_b / "train_log" / "rank1.jsonl").read_text().splitlines()]
    assert steps == list(range(info["total_steps"]))
    # So do the TensorBoard event files (train.report_to): rank 0's logged values at every step,
    # those up to the checkpoint flushed by the killed attempt, the rest by the resumed one.
    log0 = [json.loads(ln) for ln in (run_b / "train_log" / "rank0.jsonl").read_text().splitlines()]
    for field in ("loss", "lr", "grad_norm", "tokens_per_s", "allreduce_wait_s"):
        assert tb_scalars(run_b, f"train/{field}") == [
            (r["step"], float(np.float32(r[field]))) for r in log0
        ], field  # TB keeps float32
    assert len({r["loss"] for r in log0}) == len(log0) and all(r["grad_norm"] > 0 for r in log0)

    # Costs: train_s counts the killed attempt's loop up to its checkpoint (carried in it) plus
    # the resumed loop, and the rows say the run was resumed.
    assert 0 < info["train_s_carried"] < info["train_s"]
    assert info["tokens"] == read_json(run_a / "train.json")["tokens"]  # every step's, once
    (killed, done) = read_json(run_b / "stages" / "attempts.json")["train"]
    assert (killed["status"], done["status"]) == ("failed", "done")  # the workers died
    assert killed["progress"] == "checkpoints/step-0000003/meta.json"
    assert 0 < killed["counted_s"] <= killed["ran_s"]
    rows = read_rows(run_b / PART_NAME)
    assert {(r["attempts"], r["resumed_from_step"], r["status"]) for r in rows} == {("2", "3", "ok")}
    assert float(rows[0]["train_s"]) == pytest.approx(info["train_s"], abs=1e-3)
    assert {r["attempts"] for r in read_rows(run_a / PART_NAME)} == {"1"}


@pytest.mark.parametrize(
    "world_size,strategy", [(4, "ddp"), (8, "ddp"), (4, "fsdp")], ids=["ddp-4", "ddp-8", "fsdp-4"]
)
def test_resume_is_bit_exact_with_more_workers(tmp_path: Path, world_size: int, strategy: str) -> None:
    """With 3 or more workers the all-reduce's order of additions decides the last bits (with 2,
    a + b = b + a): before trainer.settle_ddp_buckets, DDP weights differed by up to 1.5e-8 at 4
    workers after a resume. The resume starts from the uninterrupted run's own step-2 checkpoint,
    as a run killed after step 2 would (the kill itself is tested above)."""
    cfg = _tiny_cfg(
        tmp_path,
        f"world_size={world_size}",
        f"train.strategy={strategy}",
        "train.per_device_batch_size=1",
        f"train.global_batch_size={world_size}",
        "train.max_steps=4",
        "train.checkpoint_every=2",
        "eval.heldout_loss=false",
    )
    run_dir = run_experiment(cfg, until="train")
    uninterrupted = _trainable(run_dir, cfg)
    shutil.rmtree(run_dir / "model")
    (run_dir / "train.json").unlink()
    stage_marker(run_dir, "train").unlink()
    run_experiment(cfg, until="train")
    info = read_json(run_dir / "train.json")
    assert (info["resumed_from_step"], info["steps_run"]) == (2, 2)
    resumed = _trainable(run_dir, cfg)
    assert set(resumed) == set(uninterrupted) and resumed
    for k in uninterrupted:
        assert torch.equal(resumed[k], uninterrupted[k]), k


def test_adafactor_equals_the_transformers_one_on_plain_tensors() -> None:
    """repro.core.optim.Adafactor (written for FSDP's sharded tensors) is the recipe's Adafactor."""
    from transformers.optimization import Adafactor as Reference

    from repro.core.optim import Adafactor

    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 6)]  # a matrix, a vector (unfactored), a 3-d tensor
    ours = [torch.randn(s, requires_grad=True) for s in shapes]
    ref = [p.detach().clone().requires_grad_() for p in ours]
    o1 = Adafactor(ours, lr=1e-2, weight_decay=0.01)
    o2 = Reference(
        ref, lr=1e-2, weight_decay=0.01, scale_parameter=False, relative_step=False, warmup_init=False
    )
    for _ in range(5):
        for a, b in zip(ours, ref):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        o1.step()
        o2.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert not torch.equal(a, b.new_zeros(b.shape))


def test_optimizers_and_schedule() -> None:
    from repro.core.optim import Adafactor
    from repro.trainer import make_optimizer, make_scheduler

    p = [torch.nn.Parameter(torch.ones(3))]
    assert isinstance(make_optimizer(from_dict({}, ["train.optimizer=adafactor"]), p), Adafactor)
    assert isinstance(make_optimizer(from_dict({}, ["train.optimizer=adamw"]), p), torch.optim.AdamW)
    cfg = from_dict({}, ["train.lr=1.0", "train.warmup_steps=2", "train.schedule=linear"])
    opt = torch.optim.SGD(p, lr=1.0)
    sched = make_scheduler(cfg, opt, total_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # Warm-up to the peak over 2 steps, then linear decay to zero at the end.
    assert lrs[:2] == [0.5, 1.0]
    assert lrs[2] > lrs[3] > lrs[4] > lrs[5] > 0 and abs(lrs[2] - 1.0) < 1e-9


@pytest.mark.parametrize("schedule_steps", ["kept", "pool"])
def test_the_schedule_spans_the_kept_steps_or_the_whole_pools(tmp_path: Path, schedule_steps: str) -> None:
    """train.schedule_steps: a run keeping a fraction f of the pool ends its linear schedule at 0
    (kept) or at (1 - f) of the peak learning rate (pool: sized from the whole pool, as the
    authors' trainer), within one step's rounding; the logged lr is the one after each step."""
    peak, k = 0.01, 2
    cfg = _tiny_cfg(
        tmp_path,
        f"world_size={k}",
        "selection.method=random",
        "selection.fraction=0.4",
        "train.optimizer=sgd",
        f"train.lr={peak}",
        "train.warmup_steps=0",
        "train.schedule=linear",
        "train.per_device_batch_size=1",
        f"train.global_batch_size={k}",
        f"train.schedule_steps={schedule_steps}",
    )
    run_dir = run_experiment(cfg, until="train")
    derived = read_json(run_dir / "derived.json")
    f = derived["n_selected"] / derived["n_pool"]
    rows = [json.loads(line) for line in (run_dir / "train_log" / "rank0.jsonl").read_text().splitlines()]
    assert len(rows) == derived["total_steps"] > 1
    lrs = [r["lr"] for r in rows]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))  # decaying at every step
    pool_steps = read_json(run_dir / "train.json")["lr_schedule_steps"]
    if schedule_steps == "kept":
        assert pool_steps == derived["total_steps"] and lrs[-1] == 0.0
    else:
        assert pool_steps == -(-derived["n_pool"] // k)  # the pool's steps at one example a step
        assert lrs[-1] == pytest.approx((1 - f) * peak, abs=peak / pool_steps)
        assert lrs[-1] == pytest.approx(peak * (pool_steps - derived["total_steps"]) / pool_steps)
