"""How the trainer spreads a model over its workers: `train.strategy: ddp | fsdp`.

- ddp: every worker holds the whole model, its gradients and optimizer state; DDP all-reduces
  (averages) gradients in buckets. bf16 autocast on GPU over fp32 weights.
- fsdp: PyTorch FSDP2 (`fully_shard`) on every decoder layer and at the root. Each worker keeps
  1/world_size of the fp32 master weights, gradients and optimizer state; a layer's full weights
  exist only while it runs (all-gathered in bf16 on GPU), and gradients are reduce-scattered in
  fp32. FSDP averages gradients over workers exactly as DDP does, so with each worker's loss
  multiplied by its rank weight before backward, an fsdp step is the DDP step.

`train.activation_checkpointing` (either strategy) keeps only each decoder layer's input and
recomputes the layer in backward. Sharded checkpoints go through `torch.distributed.checkpoint`
(one file per rank plus metadata); the final model is gathered to rank 0 and saved as Hugging
Face safetensors (or a peft adapter for LoRA).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from repro.core.errors import UserValueError

STRATEGIES = ("ddp", "fsdp")


def core_model(model: Any) -> Any:
    """The transformers model inside DDP and peft wrappers."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class the model lists in `_no_split_modules`
    (transformers' own list of blocks never to split, e.g. LlamaDecoderLayer)."""
    core = core_model(model)
    names = set(getattr(core, "_no_split_modules", None) or [])
    layers = [m for m in core.modules() if type(m).__name__ in names]
    if not layers:
        raise UserValueError(
            f"{type(core).__name__}: cannot find its decoder layers (no module of a "
            f"class in _no_split_modules={sorted(names)}); train.strategy=fsdp and "
            "train.activation_checkpointing need them"
        )
    return layers


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each decoder layer in backward (non-reentrant, so frozen inputs are fine)."""
    core = core_model(model)
    core.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    core.config.use_cache = False


def wrap(model: torch.nn.Module, strategy: str, device: torch.device, bf16: bool) -> torch.nn.Module:
    """The model ready for data-parallel training under `strategy` (the group is initialized)."""
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if strategy != "fsdp":
        raise UserValueError(f"train.strategy: {strategy!r} is not one of {STRATEGIES}")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)  # the rest: embeddings, final norm, LM head
    return model


def autocast_enabled(strategy: str, bf16: bool) -> bool:
    """DDP computes in bf16 by autocast; FSDP2 by casting the gathered weights (param_dtype)."""
    return bf16 and strategy == "ddp"


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, strategy: str, sync: bool) -> Iterator[None]:
    """Accumulate gradients locally (sync=False) or reduce them across workers (sync=True)."""
    wrapped: Any = model  # a DistributedDataParallel (ddp) or an FSDPModule (fsdp); see `wrap`
    if strategy == "ddp":
        with contextlib.nullcontext() if sync else wrapped.no_sync():
            yield
        return
    wrapped.set_requires_gradient_sync(sync)
    yield


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose parameter names carry no wrapper prefix (FSDP2 wraps in place)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return model.module if isinstance(model, DDP) else model


def _local_bytes(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer, strategy: str) -> dict[str, int]:
    """This worker's bytes of parameters, gradients, optimizer state and DDP's gradient buckets
    (call after backward, before zero_grad): the model state a strategy shards."""
    from repro.core.optim import optimizer_state_bytes

    params = list(unwrapped(model).parameters())
    out = {
        "params": sum(_local_bytes(p) for p in params),
        "grads": sum(_local_bytes(p.grad) for p in params),
        "optimizer": optimizer_state_bytes(opt),
        "ddp_buckets": 0,
    }
    if strategy == "ddp":  # the reducer's flat bucket copy of every trainable gradient
        out["ddp_buckets"] = sum(p.numel() * 4 for p in params if p.requires_grad)
    return out


# ----------------------------------------------------------------------------- sharded state


def _options(full: bool, trainable_only: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # strict=False: a state without the frozen weights (LoRA: only the adapter) loads into the
    # whole model; every trainable key is there, since the state came from this same model.
    return StateDictOptions(
        full_state_dict=full, cpu_offload=full, ignore_frozen_params=trainable_only, strict=not trainable_only
    )


def save_sharded(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """All ranks: write the trainable weights and optimizer state, one file per rank, to `path`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt, options=_options(False, True))
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(path))


def load_sharded(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """All ranks: restore what `save_sharded` wrote (resharded if the layout allows)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, opt, options=_options(False, True))
    state: dict[str, Any] = {"model": msd, "optimizer": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model,
        opt,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=_options(False, True),
    )


def full_state_dict(model: torch.nn.Module, trainable_only: bool) -> dict[str, torch.Tensor]:
    """All ranks: the whole (unsharded) weights, on rank 0's CPU; other ranks get {}."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    sd = get_model_state_dict(model, options=_options(True, trainable_only))
    return cast("dict[str, torch.Tensor]", sd) if dist.get_rank() == 0 else {}
