"""`cluster-repro bench paper-step`: the paper recipe's training step on a published model shape.

    cluster-repro bench paper-step --shape llama-2-7b --strategy fsdp --activation-checkpointing \\
        --steps 4 --grad-accum 8 [--world-size 1] [--seq-len 1216] [--out paper-step.json]

Random weights of the named shape (repro/core/memory.py SHAPES; `--layers` keeps the width and cuts
the depth, for a quick CPU check), no download; sequences of exactly `--seq-len` tokens from the
byte-level tokenizer over seeded random text, every token trained. Each worker runs the trainer's
own parts: `repro.core.sharding.wrap` (ddp or FSDP2), the recipe's Adafactor, the weighted loss,
gradient accumulation with the synchronization only on the last micro-batch.

Prints one JSON object: the median step time after a warm-up step, tokens/s (all workers),
MFU = 6 P T / (step time x workers x the device's dense bf16 peak) — the model-FLOPs count,
also with activation checkpointing, which recomputes the forward — the peak memory per worker
(GPU: allocated bytes during the steps; CPU: peak RSS) beside the memory plan's prediction, and
the lean feature pass (CluSTER's step 1) on the same shape and length: examples/s, and the
selection's cost as a share of 2-epoch full-data training at the recipe's settings,
    share = feature s per example / (2 epochs x training GPU-s per example).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from repro.core.argtypes import int_range, non_negative_int, positive_float, positive_int
from repro.core.errors import UserValueError

# Dense bf16 tensor-core peaks (TFLOP/s per GPU), from the vendors' data sheets (SXM parts).
DEVICE_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def device_peak_tflops(name: str) -> float | None:
    for key, peak in DEVICE_PEAK_TFLOPS.items():
        if key in name:
            return peak
    return None


def _model_config(shape: Any, layers: int | None) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=layers or shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=shape.tied_embeddings,
        attention_bias=shape.qkv_bias,
        max_position_embeddings=4096,
    )


def _sequences(n: int, seq_len: int, seed: int) -> torch.Tensor:
    """n rows of exactly seq_len byte-tokenizer ids, from seeded random printable text."""
    import random

    from repro.core.models import _byte_level_tokenizer

    tok = _byte_level_tokenizer()
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text = "".join(chr(rng.randrange(32, 127)) for _ in range(seq_len))
        rows.append(tok(text)["input_ids"][:seq_len])
    return torch.tensor(rows)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _features(model: Any, seq_len: int, batch: int, n: int, device: torch.device) -> dict[str, Any]:
    """Time the lean gradient-proxy feature pass (method/features.py) on n sequences."""
    from method.features import gradient_proxy_features
    from repro.core.lmhead import HeadWorkspace

    ids = _sequences(n, seq_len, seed=7).to(device)
    ws = HeadWorkspace()
    model.eval()
    times = []
    with torch.no_grad():
        for _rep in range(2):  # the first pass warms up kernels and the workspace
            _sync(device)
            t0 = time.perf_counter()
            for i in range(0, n, batch):
                x = ids[i : i + batch]
                b = {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x.clone()}
                gradient_proxy_features(model, b, workspace=ws)
            _sync(device)
            times.append(time.perf_counter() - t0)
    model.train()
    return {"batch": batch, "examples": n, "s": times[-1], "examples_per_s": n / times[-1]}


def _worker(rank: int, world_size: int, args: dict[str, Any], out: str) -> None:
    from repro.core import sharding
    from repro.core.distributed import set_worker_threads, worker_device
    from repro.core.lmhead import weighted_lm_loss
    from repro.core.memory import SHAPES
    from repro.core.optim import make_optimizer

    device = worker_device(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        set_worker_threads(world_size)
    shape = SHAPES[args["shape"]]
    bf16 = device.type == "cuda"
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    build_on = device if args["strategy"] == "ddp" or device.type == "cuda" else torch.device("cpu")
    with torch.device(build_on):
        model = AutoModelForCausalLM.from_config(_model_config(shape, args["layers"]), dtype=torch.float32)
    if args["lora"]:
        from repro.core.config.schema import ModelConfig
        from repro.core.models import _wrap_lora

        model = _wrap_lora(model, ModelConfig())
    params_total = sum(p.numel() for p in model.parameters())

    feats = None
    if args["feature_examples"] and rank == 0:
        feats = _features(model, args["seq_len"], args["feature_batch"], args["feature_examples"], device)
    if args["activation_checkpointing"]:
        sharding.enable_activation_checkpointing(model)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    wrapped = sharding.wrap(model, args["strategy"], device, bf16)
    opt = make_optimizer(
        args["optimizer"], [p for p in wrapped.parameters() if p.requires_grad], lr=5e-5, weight_decay=0.0
    )
    b, accum, seq = args["batch"], args["grad_accum"], args["seq_len"]
    data = _sequences(b * accum, seq, seed=100 + rank).to(device)
    autocast = sharding.autocast_enabled(args["strategy"], bf16)
    step_s = []
    for _step in range(args["steps"]):
        _sync(device)
        t0 = time.perf_counter()
        for micro in range(accum):
            x = data[micro * b : (micro + 1) * b]
            with sharding.gradient_sync(wrapped, args["strategy"], micro == accum - 1):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                    logits = wrapped(input_ids=x).logits
                loss = weighted_lm_loss(logits, x, torch.ones(b, device=device)) / accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        step_s.append(time.perf_counter() - t0)
    result = {
        "rank": rank,
        "step_s": step_s,
        "peak_bytes": _peak_bytes(device),
        "params": params_total,
        "features": feats,
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "device": device.type,
    }
    gathered: list[Any] = [None] * world_size
    if world_size > 1:
        dist.all_gather_object(gathered, result)
    else:
        gathered = [result]
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))


def bench_paper_step(
    shape: str,
    strategy: str,
    activation_checkpointing: bool,
    steps: int,
    grad_accum: int,
    world_size: int = 1,
    seq_len: int = 1216,
    batch: int = 1,
    optimizer: str = "adafactor",
    lora: bool = False,
    layers: int | None = None,
    feature_batch: int = 8,
    feature_examples: int = 16,
    peak_tflops: float | None = None,
    default_malloc: bool = False,
) -> dict[str, Any]:
    """Run the step (and the feature pass) and return the JSON-ready summary."""
    import tempfile

    from repro.core.distributed import spawn_workers
    from repro.core.memory import SHAPES, plan_memory, replace_layers

    if shape not in SHAPES:
        raise UserValueError(f"--shape {shape!r}: one of {', '.join(sorted(SHAPES))}")
    if steps < 2:
        raise UserValueError("--steps: at least 2 (the first step is a warm-up, not timed)")
    args = dict(
        shape=shape,
        strategy=strategy,
        default_malloc=default_malloc,
        activation_checkpointing=activation_checkpointing,
        steps=steps,
        grad_accum=grad_accum,
        seq_len=seq_len,
        batch=batch,
        optimizer=optimizer,
        lora=lora,
        layers=layers,
        feature_batch=feature_batch,
        feature_examples=feature_examples,
    )
    # Workers are fresh processes, also at world size 1, so that on CPU their peak RSS is theirs
    # alone. Unless default_malloc: glibc serves every block >= 128 KiB by mmap and returns it
    # on free, so the RSS follows the live tensors instead of the heap's high-water mark (which
    # grows step after step with fragmentation); docs/memory.md gives both.
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    if not default_malloc:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "out.json")
            spawn_workers(_worker, world_size, args=(args, out), method="spawn")
            workers = json.loads(Path(out).read_text())
    finally:
        if saved is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    w0 = workers[0]
    timed = [statistics.median(w["step_s"][1:]) for w in workers]
    step = max(timed)
    tokens = world_size * grad_accum * batch * seq_len  # per optimizer step, all workers
    params = w0["params"]
    peak = peak_tflops or (device_peak_tflops(w0["device_name"]) if w0["device"] == "cuda" else None)
    mfu = 6 * params * tokens / (step * world_size * peak * 1e12) if peak else None
    sh = replace_layers(SHAPES[shape], layers)
    plan = plan_memory(
        sh,
        strategy=strategy,
        world_size=world_size,
        seq_len=seq_len,
        batch=batch,
        optimizer=optimizer,
        lora_r=8 if lora else None,
        lora_targets=["q_proj", "v_proj"] if lora else None,
        activation_checkpointing=activation_checkpointing,
        device=w0["device"],
    )
    measured = max(w["peak_bytes"] for w in workers)
    predicted = plan.peak + plan.process_overhead
    out: dict[str, Any] = {
        "shape": shape,
        "layers": layers or SHAPES[shape].layers,
        "params": params,
        "strategy": strategy,
        "activation_checkpointing": activation_checkpointing,
        "optimizer": optimizer,
        "lora": lora,
        "world_size": world_size,
        "seq_len": seq_len,
        "per_device_batch": batch,
        "grad_accum": grad_accum,
        "steps": steps,
        "step_s": step,
        "tokens_per_s": tokens / step,
        "mfu": mfu,
        "mfu_flops_per_token": "6P",
        "peak_tflops": peak,
        "peak_memory_mib": measured / 2**20,
        "peak_memory_kind": "allocated (torch.cuda.max_memory_allocated)"
        if w0["device"] == "cuda"
        else "peak RSS (ru_maxrss, includes building the model and the process itself; "
        + ("glibc's default allocator)" if default_malloc else "blocks >= 128 KiB mmapped)"),
        "malloc": "glibc default" if default_malloc else "mmap for blocks >= 128 KiB",
        "plan_mib": predicted / 2**20,
        "plan_over_measured": predicted / measured,
        "device": w0["device"],
        "device_name": w0["device_name"],
        "torch": torch.__version__,
    }
    f = w0.get("features")
    if f:
        train_gpu_s_per_example = step * world_size / (grad_accum * batch * world_size)
        out["features"] = f
        out["selection_share_of_2_epoch_training"] = (1.0 / f["examples_per_s"]) / (
            2 * train_gpu_s_per_example
        )
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster-repro bench paper-step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    from repro.core.memory import SHAPES

    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--strategy", choices=["ddp", "fsdp"], default="fsdp")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument(
        "--steps",
        type=int_range(2, note="the first is a warm-up, not timed"),
        default=4,
        help="optimizer steps (the first is a warm-up)",
    )
    p.add_argument("--grad-accum", type=positive_int, default=8, help="micro-batches per optimizer step")
    p.add_argument("--world-size", type=positive_int, default=1, help="workers (spawned processes)")
    p.add_argument("--seq-len", type=positive_int, default=1216, help="tokens per sequence (the recipe's)")
    p.add_argument("--batch", type=positive_int, default=1, help="sequences per micro-batch and worker")
    p.add_argument("--optimizer", choices=["adafactor", "adamw", "sgd"], default="adafactor")
    p.add_argument("--lora", action="store_true", help="LoRA r=8 on q,v instead of full fine-tuning")
    p.add_argument(
        "--layers", type=positive_int, default=None, help="keep the width, cut the depth (CPU checks)"
    )
    p.add_argument("--feature-batch", type=positive_int, default=8)
    p.add_argument("--feature-examples", type=non_negative_int, default=16, help="0 skips the feature pass")
    p.add_argument(
        "--peak-tflops",
        type=positive_float,
        default=None,
        help="the device's dense bf16 peak (default: known GPUs; none on CPU)",
    )
    p.add_argument(
        "--default-malloc",
        action="store_true",
        help="CPU: keep glibc's default allocator (RSS then includes the heap's "
        "retained free blocks); by default blocks >= 128 KiB are mmapped",
    )
    p.add_argument("--out", default=None, help="also write the JSON here")


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(a: argparse.Namespace) -> int:
    res = bench_paper_step(
        a.shape,
        a.strategy,
        a.activation_checkpointing,
        a.steps,
        a.grad_accum,
        a.world_size,
        a.seq_len,
        a.batch,
        a.optimizer,
        a.lora,
        a.layers,
        a.feature_batch,
        a.feature_examples,
        a.peak_tflops,
        a.default_malloc,
    )
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        from repro.core.io import atomic_write_text

        atomic_write_text(Path(a.out), text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
