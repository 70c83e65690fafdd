"""The memory plan: each worker's peak memory for a training cell, before anything runs.

A worker's memory is the model state it keeps for the whole run plus what one step adds. With P
parameters (P_t of them trainable: all for full fine-tuning, the adapters for LoRA), S = the
world size under fsdp (1 under ddp) and c = bytes of the compute dtype (2 for bf16 on GPU, 4 on
CPU), in bytes:

    weights      4 P / S               fp32 master weights (the trainer loads fp32)
    optimizer    AdamW 8 P_t / S; Adafactor 4 (rows + cols) per trainable matrix and 4 n per
                 vector, / S; SGD 0
    ddp buckets  4 P_t                 DDP's flat copy of the gradients it all-reduces (ddp only)
    gradients    4 P_t / S             fp32

and four moments of a step, the peak being the largest:

    forward end    state + activations + logits + compute copies of the weights
    loss backward  forward end + the loss's gradients (8 bytes per token and vocabulary entry),
                   or the logits' gradient + the LM head's weight gradient if larger
    backward end   state + gradients + (fsdp) one group's gathered weights and gradient in flight
    optimizer      state + gradients + the step's temporaries (4, 3 or 1 x the largest local
                   parameter for Adafactor, AdamW, SGD)

Activations per decoder layer and token, counted from what a Llama layer saves for backward
(SDPA attention, SwiGLU MLP): c (6 h + 2 kv + 4 i) + 4 (2 h) bytes (the two RMSNorms keep fp32),
where h, kv, i are the hidden, key/value and MLP widths; on SmolLM2's layer at 512 tokens this is
21.75 MiB against 21.8 MiB counted with torch's saved-tensor hooks. With LoRA the frozen Linears
keep no input for a weight gradient: c (3 h + 2 kv + 3 i) + 8 h (15.38 MiB against 15.43 counted).
With activation checkpointing
a layer keeps only its input (c h per token) and one layer is recomputed at a time. The logits
hold c + 4 bytes per token and vocabulary entry (the logits and the log-softmax the loss saves).
Compute copies: under ddp with bf16 autocast, the bf16 copies of every Linear weight saved for
backward (2 P_linear); under fsdp, the gathered (unsharded) weights of the root and of the
running layer, c bytes each. Under fsdp a group's gradient in flight is held unsharded (c), as
the fp32 reduce-scatter input (4) and output (4 / S with NCCL; 4 with gloo, which reduces the
whole buffer), for the largest group (the root: embeddings and LM head).

Every worker first loads the whole fp32 model into host memory (4 P; fsdp then copies out its
shard, 4 P / S more) and only then moves it (ddp) or its shard (fsdp) to the GPU: on CPU this
load is a fourth moment of the peak; on GPU it is the host memory a worker needs (`host`).

A GPU cell fits when plan x (1 + FRAGMENTATION) + CUDA_CONTEXT_GIB <= the profile's
`gpu.memory_gb` (GiB, as nvidia-smi reports MiB / 1024). On CPU the plan adds the worker
process's own resident size (Python, torch, transformers: CPU_PROCESS_MIB, measured) and predicts
its peak RSS. docs/measurements.md lists every calibration point and how close the plan came.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from repro.core.errors import UserValueError

GIB = 2**30
MIB = 2**20
CUDA_CONTEXT_GIB = 1.0  # the CUDA context and NCCL buffers, outside torch's allocator
FRAGMENTATION = 0.05  # the caching allocator's slack over the allocated peak
# Peak RSS of a training worker whose model is negligible (the tiny model): the interpreter,
# torch, transformers, peft, tokenizers and gloo. Measured on CPU: docs/measurements.md.
CPU_PROCESS_MIB = 410.0


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-family decoder (Llama 2, CodeLlama, Mistral, SmolLM2, Qwen2-like)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False

    @property
    def kv_dim(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def layer_linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each Linear in one decoder layer, by module name."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        bias = (self.hidden + 2 * self.kv_dim) if self.qkv_bias else 0
        return sum(a * b for a, b in self.layer_linears().values()) + 2 * self.hidden + bias

    def root_params(self) -> int:
        """Embeddings, final norm and LM head (FSDP's root group)."""
        emb = self.vocab * self.hidden
        return emb * (1 if self.tied_embeddings else 2) + self.hidden

    def params(self) -> int:
        return self.layers * self.layer_params() + self.root_params()

    def linear_params(self) -> int:
        """Weights of Linear layers (what bf16 autocast copies): the layers' and the LM head."""
        lin = sum(a * b for a, b in self.layer_linears().values()) * self.layers
        return lin + self.vocab * self.hidden

    def matrices(self) -> list[tuple[int, int]]:
        """Every 2-d weight (rows, cols), for Adafactor's factored state."""
        per_layer = [(b, a) for a, b in self.layer_linears().values()]
        root = [(self.vocab, self.hidden)] * (1 if self.tied_embeddings else 2)
        return per_layer * self.layers + root

    def vectors(self) -> int:
        return self.layers * 2 * self.hidden + self.hidden


# Published shapes, so a plan needs no download (config.json of each model on the hub).
SHAPES: dict[str, ModelShape] = {
    "llama-2-7b": ModelShape(4096, 11008, 32, 32, 32, 32000),
    "llama-2-13b": ModelShape(5120, 13824, 40, 40, 40, 32000),
    "codellama-7b-python": ModelShape(4096, 11008, 32, 32, 32, 32000),
    "codellama-13b-python": ModelShape(5120, 13824, 40, 40, 40, 32000),
    "smollm2-135m": ModelShape(576, 1536, 30, 9, 3, 49152, tied_embeddings=True),
    "tiny-random-llama": ModelShape(64, 256, 2, 4, 4, 259),  # the tests' model (repro/core/models.py)
    "mistral-7b-v0.3": ModelShape(4096, 14336, 32, 32, 8, 32768),
    "llama-3.1-8b": ModelShape(4096, 14336, 32, 32, 8, 128256),
    "qwen2.5-7b": ModelShape(3584, 18944, 28, 28, 4, 152064, qkv_bias=True),
    "qwen2.5-14b": ModelShape(5120, 13824, 48, 40, 8, 152064, qkv_bias=True),
}
HUB_IDS = {
    "meta-llama/llama-2-7b-hf": "llama-2-7b",
    "meta-llama/llama-2-13b-hf": "llama-2-13b",
    "codellama/codellama-7b-python-hf": "codellama-7b-python",
    "codellama/codellama-13b-python-hf": "codellama-13b-python",
    "smollm2-135m-instruct": "smollm2-135m",
    "huggingfacetb/smollm2-135m-instruct": "smollm2-135m",
    "mistralai/mistral-7b-v0.3": "mistral-7b-v0.3",
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "qwen/qwen2.5-7b": "qwen2.5-7b",
    "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
    "qwen/qwen2.5-14b": "qwen2.5-14b",
    "qwen/qwen2.5-14b-instruct": "qwen2.5-14b",
}


def shape_from_hf_config(cfg: dict[str, Any]) -> ModelShape:
    """A shape from a transformers config.json (Llama-family keys)."""
    try:
        return ModelShape(
            hidden=cfg["hidden_size"],
            intermediate=cfg["intermediate_size"],
            layers=cfg["num_hidden_layers"],
            heads=cfg["num_attention_heads"],
            kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            vocab=cfg["vocab_size"],
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        )
    except KeyError as e:
        raise UserValueError(
            f"config.json lacks {e.args[0]!r}: not a Llama-family decoder the memory plan knows"
        ) from None


def model_shape(name_or_path: str, tiny_hidden: int = 64, tiny_layers: int = 2) -> ModelShape | None:
    """The shape of `model.name_or_path`: a known hub id or builtin, a local directory's
    config.json, or None when it cannot be known without a download."""
    key = name_or_path.lower()
    if key == "tiny-random-llama":  # repro/core/models.py: byte tokenizer (259 ids), 4 heads
        return ModelShape(tiny_hidden, 4 * tiny_hidden, tiny_layers, 4, 4, 259)
    if key in SHAPES:
        return SHAPES[key]
    if key in HUB_IDS:
        return SHAPES[HUB_IDS[key]]
    cfg = Path(name_or_path).expanduser() / "config.json"
    if cfg.is_file():
        return shape_from_hf_config(json.loads(cfg.read_text(encoding="utf-8")))
    return None


@dataclass
class MemoryPlan:
    """Bytes per worker; `peak` is the largest of the three moments of a step."""

    weights: float
    gradients: float
    optimizer: float
    ddp_buckets: float
    activations: float
    logits: float
    compute_copies: float
    step_temporaries: float
    forward_end: float
    loss_backward: float
    backward_end: float
    optimizer_step: float
    load: float  # loading: each worker reads the whole fp32 model into host memory first
    peak: float
    device: str
    process_overhead: float  # CPU: the worker process's own RSS; GPU: 0 (context counted in fits)
    host: float  # GPU runs: peak host RSS per worker (the load, plus the process itself)

    @property
    def peak_gib(self) -> float:
        return self.peak / GIB

    def required_gib(self) -> float:
        """What the device must have: GPU = peak + slack + context; CPU = predicted peak RSS."""
        if self.device == "cuda":
            return self.peak * (1 + FRAGMENTATION) / GIB + CUDA_CONTEXT_GIB
        return (self.peak + self.process_overhead) / GIB

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(peak_gib=round(self.peak_gib, 3), required_gib=round(self.required_gib(), 3))
        return d


def lora_matrices(shape: ModelShape, r: int, targets: list[str]) -> list[tuple[int, int]]:
    """Every adapter matrix (rows, cols): A is (r, in) and B is (out, r) per targeted Linear."""
    per_layer = []
    for name, (a, b) in shape.layer_linears().items():
        if name in targets:
            per_layer += [(r, a), (b, r)]
    return per_layer * shape.layers


def plan_memory(
    shape: ModelShape,
    *,
    strategy: str,
    world_size: int,
    seq_len: int,
    batch: int,
    optimizer: str,
    lora_r: int | None = None,
    lora_targets: list[str] | None = None,
    activation_checkpointing: bool = False,
    device: str = "cuda",
    bf16: bool = True,
) -> MemoryPlan:
    """Each worker's peak memory (bytes) for one training cell; see the module docstring."""
    s = world_size if strategy == "fsdp" else 1
    c = 2 if (device == "cuda" and bf16) else 4
    P = shape.params()
    lora = lora_r is not None
    if lora:
        mats = lora_matrices(shape, lora_r or 0, lora_targets or [])
        vectors = 0
    else:
        mats, vectors = shape.matrices(), shape.vectors()
    Pt = sum(a * b for a, b in mats) + vectors
    h, kv, i, tokens = shape.hidden, shape.kv_dim, shape.intermediate, seq_len * batch

    weights = 4 * P / s
    grads = 4 * Pt / s
    if optimizer == "adamw":
        opt = 8 * Pt / s
    elif optimizer == "adafactor":  # factored: a row and a column statistic per matrix
        opt = 4 * (sum(rows + cols for rows, cols in mats) + vectors) / s
    else:
        opt = 0.0
    buckets = 4 * Pt if strategy == "ddp" else 0.0
    state = weights + opt + buckets

    # Saved for backward per layer and token (counted with saved_tensors_hooks on SmolLM2's
    # layer: 21.8 MiB at 512 tokens, this formula 21.75): attention and MLP tensors in the
    # compute dtype, the two RMSNorms' inputs and normalized values in fp32.
    per_layer_token = c * (6 * h + 2 * kv + 4 * i) + 4 * 2 * h
    if lora:  # frozen Linears keep no input for a weight gradient (15.43 MiB counted, 15.38 here)
        per_layer_token = c * (3 * h + 2 * kv + 3 * i) + 4 * 2 * h
    if activation_checkpointing:
        acts = shape.layers * tokens * c * h + tokens * per_layer_token
    else:
        acts = shape.layers * tokens * per_layer_token
    tv = tokens * shape.vocab
    logits = tv * (c + 4)  # the logits and the log-softmax the loss saves
    root, layer = shape.root_params(), shape.layer_params()
    copies: float
    if strategy == "fsdp":  # the root and one layer gathered (unsharded) in the compute dtype
        copies = c * (root + layer)
    else:  # bf16 autocast keeps a bf16 copy of every Linear weight for backward
        copies = 2.0 * shape.linear_params() if c == 2 else 0.0
    # The step's full-size temporaries of the largest parameter: Adafactor squares the gradient,
    # forms the row x column factor and the update; AdamW and SGD fewer.
    temps = {"adafactor": 4, "adamw": 3}.get(optimizer, 1)
    temporaries = temps * 4 * max(a * b for a, b in mats) / s
    head_grad = 0 if lora else 4 * shape.vocab * h
    if strategy == "fsdp" and not lora:
        # A group's gradient in flight: unsharded (compute dtype), the fp32 reduce-scatter input,
        # and its output (gloo on CPU reduces the whole buffer; NCCL writes only the shard).
        out = 4 if device == "cpu" else 4 / s
        in_flight = copies + (c + 4 + out) * max(root, layer)
    else:  # LoRA under fsdp: only the gathered weights; ddp: the bf16 copies are freed by now
        in_flight = copies if strategy == "fsdp" else 0.0

    # On CPU, DDP's buckets are zero pages that no forward touches: measured, a CPU DDP worker's
    # RSS at the forward and loss moments does not hold them (docs/memory.md); a GPU allocates them.
    fwd_state = state - buckets if device == "cpu" else state
    forward_end = fwd_state + acts + logits + copies
    # The loss's backward: the log-softmax's gradient and the logits' (fp32), then the LM head's
    # weight gradient while the logits' gradient is still held.
    loss_backward = forward_end + max(8 * tv, 4 * tv + head_grad)
    backward_end = state + grads + in_flight
    optimizer_step = state + grads + temporaries
    # Every worker loads the whole fp32 model on the CPU; fsdp then copies its shard out.
    load = 4 * P * (1 + (1 / s if strategy == "fsdp" else 0))
    moments = [forward_end, loss_backward, backward_end, optimizer_step] + ([load] if device == "cpu" else [])
    peak = max(moments)
    overhead = CPU_PROCESS_MIB * MIB
    return MemoryPlan(
        weights=weights,
        gradients=grads,
        optimizer=opt,
        ddp_buckets=buckets,
        activations=acts,
        logits=logits,
        compute_copies=copies,
        step_temporaries=temporaries,
        forward_end=forward_end,
        loss_backward=loss_backward,
        backward_end=backward_end,
        optimizer_step=optimizer_step,
        load=load,
        peak=peak,
        device=device,
        process_overhead=overhead if device == "cpu" else 0.0,
        host=overhead + load,
    )


def plan_for_config(cfg: Any, device: str = "cuda") -> MemoryPlan | None:
    """The plan of an ExperimentConfig's training (None when the model's shape is unknown)."""
    shape = model_shape(cfg.model.name_or_path, cfg.model.tiny_hidden_size, cfg.model.tiny_layers)
    if shape is None:
        return None
    lo = cfg.model.lora
    return plan_memory(
        shape,
        strategy=cfg.train.strategy,
        world_size=cfg.world_size,
        seq_len=cfg.data.max_length,
        batch=cfg.train.per_device_batch_size,
        optimizer=cfg.train.optimizer,
        lora_r=lo.r if lo.enabled else None,
        lora_targets=list(lo.target_modules) if lo.enabled else None,
        activation_checkpointing=cfg.train.activation_checkpointing,
        device=device,
        bf16=cfg.model.precision in ("auto", "bf16"),
    )


def fit_advice(cfg: Any, memory_gib: float) -> tuple[MemoryPlan | None, str | None]:
    """(plan, None) when the cell fits a GPU of `memory_gib`; (plan, what to change) when not."""
    plan = plan_for_config(cfg)
    if plan is None or plan.required_gib() <= memory_gib:
        return plan, None
    t, ws = cfg.train, cfg.world_size
    options: list[tuple[str, int, dict[str, Any]]] = [
        ("train.strategy=fsdp", ws, dict(strategy="fsdp")),
        ("train.activation_checkpointing=true", ws, dict(activation_checkpointing=True)),
        (
            "train.strategy=fsdp train.activation_checkpointing=true",
            ws,
            dict(strategy="fsdp", activation_checkpointing=True),
        ),
    ]
    options += [
        (
            f"world_size={more} with fsdp and checkpointing",
            more,
            dict(strategy="fsdp", activation_checkpointing=True),
        )
        for more in (2 * ws, 4 * ws)
    ]
    fix = "a GPU with more memory (no strategy here fits)"
    for label, size, change in options:
        if size == ws and all(getattr(t, k) == v for k, v in change.items()):
            continue  # the cell's own settings
        p = plan_for_config(replace(cfg, world_size=size, train=replace(t, **change)))
        if p is not None and p.required_gib() <= memory_gib:
            fix = f"{label} ({p.required_gib():.1f} GiB)"
            break
    return plan, (
        f"needs {plan.required_gib():.1f} GiB per GPU (peak {plan.peak_gib:.1f} GiB + "
        f"{FRAGMENTATION:.0%} slack + {CUDA_CONTEXT_GIB:g} GiB context), more than "
        f"gpu.memory_gb = {memory_gib:g}; fits with {fix}"
    )


def replace_layers(shape: ModelShape, layers: int | None) -> ModelShape:
    """The same widths with `layers` decoder layers (None: unchanged)."""
    return shape if layers is None else replace(shape, layers=layers)
