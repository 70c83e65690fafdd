"""Benchmark (not a test): the efficient feature form vs the naive form vs a plain forward pass.

Measured side by side in ONE process, on the SAME batches, forms interleaved in every repeat:
(a) `gradient_proxy_features` (body once, LM head at response positions only, chunked, one head
    workspace reused over the batches as the feature loops do),
(b) `gradient_proxy_features_naive` (all hidden states, full-vocab log_softmax everywhere),
(c) plain `model(input_ids, attention_mask, use_cache=False).logits`.
All three run under torch.inference_mode() (the features' own mode; stricter than no_grad) and
without a KV cache, so the comparison is only about what each form computes. Throughput is
examples/s from the median of `repeats` timings of all `n_batches` batches.

Working memory ABOVE the loaded model, per form: on CPU the peak-RSS increase in a FRESH
subprocess per (form, batch size) (the model is loaded, the kernel's RSS high-water mark is reset
through /proc/self/clear_refs once the weights are paged in, the form runs over the batches
once, VmHWM - VmRSS-before is read); torch's CPU allocations bypass tracemalloc, and RSS is what an
out-of-memory kill sees. On
CUDA: torch.cuda.max_memory_allocated above the allocation before the form, in process.

Batches: real text (the demo pool's rendered examples, tokenized with the model's tokenizer and
cut into examples) or, for a random model without a tokenizer, random ids; each example has
length ~ U[0.4, 1.0] * max_length, of which a share ~ U[0.25, 0.6] is prompt; right padding.

    CLUSTER_REPRO_CACHE=/tmp/smol-cache python -m repro.bench.features --model smollm2-135m-instruct
    python -m repro.bench.features --model llama-2-7b --device cuda --dtype bf16   # random weights
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from method.features import gradient_proxy_features, gradient_proxy_features_naive
from repro.core.argtypes import int_list, int_range, positive_int
from repro.core.lmhead import HeadWorkspace

FORMS = ("efficient", "naive", "plain")
# Published shapes, for timing on a GPU without downloading weights (random initialization).
_SHAPES = {
    "llama-2-7b": dict(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=11008,
        vocab_size=32000,
    ),
    "llama-2-13b": dict(
        hidden_size=5120,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=40,
        intermediate_size=13824,
        vocab_size=32000,
    ),
    "codellama-7b-python": dict(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=11008,
        vocab_size=32000,
        rope_theta=1e6,
        max_position_embeddings=16384,
    ),
}


def llama_config_like(name: str):
    """A LlamaConfig with the shape of a published model (`_SHAPES`), for random-weight timing."""
    from transformers import LlamaConfig

    if name not in _SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(_SHAPES)}")
    return LlamaConfig(rms_norm_eps=1e-5, tie_word_embeddings=False, **_SHAPES[name])


def _load(model_dir: Any, device: str, dtype: torch.dtype) -> tuple[Any, Any, str]:
    """(model in eval mode, tokenizer or None, label). A shape name or a config: random weights."""
    from transformers import AutoModelForCausalLM, PretrainedConfig

    if isinstance(model_dir, str) and model_dir in _SHAPES:
        model_dir = llama_config_like(model_dir)
    if isinstance(model_dir, PretrainedConfig):
        torch.manual_seed(0)
        with torch.device(device):  # initialized on the device: no 28 GB fp32 detour on the host
            model = AutoModelForCausalLM.from_config(model_dir, dtype=dtype)
        return model.eval(), None, f"random {model_dir.model_type} h{model_dir.hidden_size}"
    from repro.core.config.schema import LoraConfig, ModelConfig
    from repro.core.models import load_model_and_tokenizer

    cfg = ModelConfig(name_or_path=str(model_dir), lora=LoraConfig(enabled=False))
    model, tok = load_model_and_tokenizer(Path(model_dir), cfg, device=device)
    return model.to(dtype).eval(), tok, Path(model_dir).name


def _batches(
    tok: Any, vocab: int, batch_size: int, n_batches: int, max_length: int, seed: int = 0
) -> list[dict]:
    """Deterministic in the arguments (the memory subprocesses rebuild the very same batches)."""
    from repro.core.tokens import IGNORE_INDEX, collate

    rng = random.Random(seed * 1000 + batch_size)
    if tok is not None:
        from repro.core.prompts import render
        from repro.demo.source import DemoSource

        rows = DemoSource().rows(seed).train  # the demo pool at its default size (480 rows)
        texts = [r.prompt + r.response + "\n\n" for r in (render(x, DemoSource.format) for x in rows)]
        stream = [t for ids in tok(texts, add_special_tokens=False)["input_ids"] for t in ids]
        pad = tok.pad_token_id
    else:
        g = torch.Generator().manual_seed(seed)
        stream = torch.randint(0, vocab, (200_000,), generator=g).tolist()
        pad = 0
    out = []
    for _ in range(n_batches):
        items = []
        for _ in range(batch_size):
            n = rng.randint(int(0.4 * max_length), max_length)
            n_prompt = int(n * rng.uniform(0.25, 0.6))
            start = rng.randrange(len(stream) - n)
            ids = stream[start : start + n]
            items.append({"input_ids": ids, "labels": [IGNORE_INDEX] * n_prompt + ids[n_prompt:]})
        out.append(collate(items, pad))
    return out


# One head workspace for all batches, as the feature loops (compute_features, the sharded worker)
# use it: its buffer is allocated once, not per chunk.
_WORKSPACE = HeadWorkspace()


def _run(form: str, model: Any, batch: dict, bf16: bool) -> None:
    if form == "efficient":
        gradient_proxy_features(model, batch, bf16=bf16, workspace=_WORKSPACE)
    elif form == "naive":
        gradient_proxy_features_naive(model, batch, bf16=bf16)
    else:
        with (
            torch.inference_mode(),
            torch.autocast(batch["input_ids"].device.type, dtype=torch.bfloat16, enabled=bf16),
        ):
            _ = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
            ).logits


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _measure_memory_here(form: str, model: Any, batches: list[dict], device: str, bf16: bool) -> float:
    """MiB above the state before the form (see the module docstring for the method)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        for b in batches:
            _run(form, model, b, bf16)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    # Weights loaded from safetensors may still be file-backed pages that the first forward pulls
    # in (~the model's size of RSS): page them in, and run one tiny forward for lazy init, first.
    with torch.inference_mode():
        for t in (*model.parameters(), *model.buffers()):
            t.sum()
    _run("plain", model, {k: v[:1, :16] for k, v in batches[0].items()}, bf16)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
    base = _status_kb("VmRSS")
    for b in batches:
        _run(form, model, b, bf16)
    return (_status_kb("VmHWM") - base) / 1024


def _memory_subprocess(
    form: str, model_dir: Any, batch_size: int, max_length: int, n_batches: int, dtype: torch.dtype
) -> float | None:
    cmd = [
        sys.executable,
        "-m",
        "repro.bench.features",
        "--mem-form",
        form,
        "--model",
        str(model_dir),
        "--batch-sizes",
        str(batch_size),
        "--max-length",
        str(max_length),
        "--n-batches",
        str(n_batches),
        "--dtype",
        "bf16" if dtype == torch.bfloat16 else "fp32",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if r.returncode != 0:
        print(f"[bench] memory subprocess for {form} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
        return None
    return float(json.loads(r.stdout.strip().splitlines()[-1])["mem_mb"])


def bench_features(
    model_dir: Any,
    batch_sizes: tuple[int, ...] = (8, 16),
    max_length: int = 256,
    repeats: int = 5,
    n_batches: int = 3,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    out_json: Path | None = None,
) -> list[dict]:
    """One row per batch size: examples/s of the three forms, ratios to plain, working memory.

    Wall-clock throughput, and on CPU also the ratios by process CPU seconds (less sensitive to
    other jobs sharing the cores). Rows so far are rewritten to `out_json` after each batch size.

    `model_dir`: a local model directory, or a shape name of `_SHAPES` / a transformers config
    (random weights: GPU timing without downloads). On CUDA the features run under bf16 autocast.
    """
    model, tok, label = _load(model_dir, device, dtype)
    bf16 = device.startswith("cuda")
    vocab = model.get_output_embeddings().weight.shape[0]
    rows = []
    for bs in batch_sizes:
        batches = [
            {k: v.to(device) for k, v in b.items()} for b in _batches(tok, vocab, bs, n_batches, max_length)
        ]
        for form in FORMS:  # warm-up: allocator, kernels, lazy initialization
            _run(form, model, batches[0], bf16)
        times: dict[str, list[float]] = {f: [] for f in FORMS}
        cpu: dict[str, list[float]] = {f: [] for f in FORMS}
        for rep in range(repeats):
            for form in FORMS[rep % 3 :] + FORMS[: rep % 3]:  # rotate: no form always runs first
                _sync(device)
                t0, c0 = time.perf_counter(), time.process_time()
                for b in batches:
                    _run(form, model, b, bf16)
                _sync(device)
                times[form].append(time.perf_counter() - t0)
                cpu[form].append(time.process_time() - c0)
        eps = {f: n_batches * bs / statistics.median(times[f]) for f in FORMS}
        cells = sum(b["attention_mask"].numel() for b in batches)  # padded positions
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        resp = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
        row = {
            "model": label,
            "device": device,
            "dtype": str(dtype).replace("torch.", ""),
            "batch_size": bs,
            "max_length": max_length,
            "n_batches": n_batches,
            "repeats": repeats,
            "padded_len": cells / (n_batches * bs),
            "real_tokens_share": real / cells,
            "response_share": resp / cells,  # positions that meet the LM head in (a)
            **{f"{f}_ex_s": eps[f] for f in FORMS},
            **{f"{f}_times_s": times[f] for f in FORMS},
            **{f"{f}_cpu_s": cpu[f] for f in FORMS},
            "efficient_vs_plain_cpu": statistics.median(cpu["plain"]) / statistics.median(cpu["efficient"]),
            "naive_vs_plain_cpu": statistics.median(cpu["plain"]) / statistics.median(cpu["naive"]),
            "efficient_vs_plain": eps["efficient"] / eps["plain"],
            "naive_vs_plain": eps["naive"] / eps["plain"],
        }
        # CPU: a fresh process per form, so one form's freed-but-cached heap cannot hide another's
        # peak; a config object cannot be passed to a subprocess, so it is measured here.
        fresh = device == "cpu" and isinstance(model_dir, (str, Path))
        for form in FORMS:
            row[f"{form}_mem_mb"] = (
                _memory_subprocess(form, model_dir, bs, max_length, n_batches, dtype)
                if fresh
                else _measure_memory_here(form, model, batches, device, bf16)
            )
        e, n = row["efficient_mem_mb"], row["naive_mem_mb"]
        row["mem_efficient_vs_naive"] = e / n if e is not None and n else None
        row["mem_method"] = (
            "cuda max_memory_allocated above baseline"
            if device != "cpu"
            else "peak RSS above the loaded model, "
            + ("fresh subprocess per form" if fresh else "in process")
        )
        rows.append(row)
        if out_json is not None:
            Path(out_json).write_text(json.dumps(rows, indent=2) + "\n")
        print(format_features([row]), file=sys.stderr, flush=True)
    return rows


def format_features(rows: list[dict]) -> str:
    """A Markdown table of `bench_features` rows."""

    def mb(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0f}"

    lines = [
        "| model | device | batch | padded len | response share | efficient ex/s | naive ex/s "
        "| plain ex/s | efficient/plain | naive/plain | same by CPU s | efficient MB | naive MB "
        "| plain MB | mem efficient/naive |",
        "|---" * 15 + "|",
    ]
    for r in rows:
        ratio = r["mem_efficient_vs_naive"]
        lines.append(
            f"| {r['model']} | {r['device']} {r['dtype']} | {r['batch_size']} | {r['padded_len']:.0f} "
            f"| {100 * r['response_share']:.0f}% | {r['efficient_ex_s']:.2f} | {r['naive_ex_s']:.2f} "
            f"| {r['plain_ex_s']:.2f} | {r['efficient_vs_plain']:.3f}x | {r['naive_vs_plain']:.3f}x "
            f"| {r['efficient_vs_plain_cpu']:.3f}x / {r['naive_vs_plain_cpu']:.3f}x "
            f"| {mb(r['efficient_mem_mb'])} | {mb(r['naive_mem_mb'])} | {mb(r['plain_mem_mb'])} "
            f"| {'n/a' if ratio is None else f'{ratio:.3f}x'} |"
        )
    return "\n".join(lines)


def _resolve_model(name: str) -> str:
    from repro.core.models import BUILTIN_MODELS, materialize_model

    if name in BUILTIN_MODELS:
        from repro.core.config.schema import LoraConfig, ModelConfig

        return str(materialize_model(ModelConfig(name_or_path=name, lora=LoraConfig(enabled=False)), seed=0))
    return name  # a directory, or a shape name of _SHAPES


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch-sizes", type=int_list(lo=1), default="8,16", help="comma-separated")
    ap.add_argument("--max-length", type=int_range(8, note="tokens"), default=256)
    ap.add_argument("--repeats", type=positive_int, default=5)
    ap.add_argument("--n-batches", type=positive_int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--mem-form", choices=FORMS, help=argparse.SUPPRESS)  # the memory subprocess


def run(a: argparse.Namespace) -> int:
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = _resolve_model(a.model)
    sizes = tuple(a.batch_sizes)
    if a.mem_form:
        m, tok, _ = _load(model, "cpu", dtype)
        vocab = m.get_output_embeddings().weight.shape[0]
        batches = _batches(tok, vocab, sizes[0], a.n_batches, a.max_length)
        print(json.dumps({"mem_mb": _measure_memory_here(a.mem_form, m, batches, "cpu", False)}))
        return 0
    rows = bench_features(model, sizes, a.max_length, a.repeats, a.n_batches, a.device, dtype, a.out)
    print(format_features(rows))
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cluster-repro bench features", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
