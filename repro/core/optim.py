"""Optimizers and the learning-rate schedule of the trainer, for DDP and for sharded (FSDP2) runs.

`Adafactor` is the paper recipe's optimizer (Shazeer & Stern, 2018) with the recipe's settings: a
fixed learning rate (no relative step, no parameter scaling), no first moment, factored second
moments for matrices, update clipping at RMS 1. It is written here because the transformers
implementation works on whole tensors only: under FSDP2 every parameter is a DTensor holding
only this rank's rows, and the factored statistics need sums over all rows. Each global
reduction below (a column mean, the mean of the row statistics, the update's RMS) is a local sum
plus one all-reduce over the parameter's mesh, so a sharded step computes the same update as an
unsharded one (up to float summation order). Its state tensors are DTensors laid out like the
parameter, so `torch.distributed.checkpoint` saves and reshards them like any FSDP state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeGuard

import torch
import torch.distributed as dist

from repro.core.errors import UserValueError

try:  # DTensor is public in torch >= 2.5; the suite pins 2.13
    from torch.distributed.tensor import DTensor, Replicate
except ImportError:  # pragma: no cover - a torch without distributed support
    DTensor = None  # type: ignore[assignment,misc]


def _is_sharded(p: torch.Tensor) -> TypeGuard[DTensor]:
    return DTensor is not None and isinstance(p, DTensor)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if _is_sharded(t) else t


def _global_sum(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Sum a per-rank partial sum over the ranks that hold shards of `p` (no-op when unsharded)."""
    if _is_sharded(p):
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=p.device_mesh.get_group())
    return x


class Adafactor(torch.optim.Optimizer):
    """Adafactor with a fixed lr; works on plain tensors and on FSDP2's row-sharded DTensors.

    For a matrix gradient G (rows x cols) at step t, with beta2_t = 1 - t^decay_rate:
        R = beta2_t R + (1 - beta2_t) rowmean(G^2 + eps1)       (a vector over rows)
        C = beta2_t C + (1 - beta2_t) colmean(G^2 + eps1)       (a vector over columns)
        U = G / sqrt(R C^T / mean(R)),   U /= max(1, RMS(U) / clip_threshold)
        W -= lr * U   (after W -= lr * weight_decay * W)
    Vectors keep an unfactored V instead of R C^T / mean(R). Defaults are the recipe's
    (transformers' Adafactor with scale_parameter=False, relative_step=False, warmup_init=False).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        eps1: float = 1e-30,
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        weight_decay: float = 0.0,
    ):
        if lr <= 0 or not math.isfinite(lr):
            raise UserValueError(f"Adafactor: lr must be a finite number > 0, got {lr}")
        super().__init__(
            params,
            dict(
                lr=lr,
                eps1=eps1,
                clip_threshold=clip_threshold,
                decay_rate=decay_rate,
                weight_decay=weight_decay,
            ),
        )

    # -- state ------------------------------------------------------------------------------
    @staticmethod
    def _init_state(p: torch.Tensor) -> dict[str, Any]:
        if p.dim() > 2 and _is_sharded(p):
            raise UserValueError(
                f"Adafactor: sharded parameters of {p.dim()} dims are not supported "
                "(FSDP2 shards dim 0; the factored statistics here assume a matrix)"
            )
        zeros = torch.zeros_like(p, dtype=torch.float32)
        if p.dim() >= 2:
            # Reductions of a DTensor keep its layout: rows stay sharded like the parameter,
            # the column statistics become one copy per rank.
            row = zeros.sum(dim=-1)
            col = zeros.sum(dim=-2)
            if _is_sharded(col):
                col = col.redistribute(col.device_mesh, [Replicate()])
            return {"step": torch.tensor(0.0), "row": row, "col": col}
        return {"step": torch.tensor(0.0), "sq": zeros}

    # -- the step ---------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        if not state:
            state.update(self._init_state(p))
        state["step"] += 1
        t = float(state["step"])
        beta2 = 1.0 - t ** group["decay_rate"]
        w = _local(p)
        assert p.grad is not None  # step() updates only the parameters that have a gradient
        g = _local(p.grad).float()
        sq = g * g + group["eps1"]
        if p.dim() >= 2:
            rows = p.shape[-2]  # the global row count (DTensor.shape is global)
            row, col = _local(state["row"]), _local(state["col"])
            row.mul_(beta2).add_(sq.mean(dim=-1), alpha=1.0 - beta2)
            col_sum = _global_sum(sq.sum(dim=-2), p) if p.dim() == 2 else sq.sum(dim=-2)
            col.mul_(beta2).add_(col_sum / rows, alpha=1.0 - beta2)
            if p.dim() == 2:
                row_mean = _global_sum(row.sum(dim=-1), p) / rows
            else:
                row_mean = row.mean(dim=-1)
            r_factor = (row / row_mean.unsqueeze(-1)).rsqrt().unsqueeze(-1)
            update = r_factor * col.unsqueeze(-2).rsqrt() * g
        else:
            v = _local(state["sq"])
            v.mul_(beta2).add_(sq, alpha=1.0 - beta2)
            update = v.rsqrt() * g
        sum_sq = _global_sum(update.pow(2).sum(), p)
        rms = (sum_sq / p.numel()).sqrt()  # p.numel() is the global size
        update.div_((rms / group["clip_threshold"]).clamp(min=1.0))
        lr = group["lr"]
        if group["weight_decay"]:
            w.add_(w, alpha=-group["weight_decay"] * lr)
        w.add_(update.to(w.dtype), alpha=-lr)


def make_optimizer(
    name: str, params: list[torch.nn.Parameter], lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """The optimizer `train.optimizer` names, over `params` (plain or DTensor)."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    if name == "adafactor":
        return Adafactor(params, lr=lr, weight_decay=weight_decay)
    raise UserValueError(f"train.optimizer: unknown optimizer {name!r} (adamw, adafactor, sgd)")


def make_scheduler(
    opt: torch.optim.Optimizer, warmup_steps: int, linear: bool, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `warmup_steps`, then constant or linear decay to 0 at `total_steps`."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if not linear:
            return 1.0
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of this rank's optimizer state tensors (the local shards under FSDP)."""
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                loc = _local(v)
                total += loc.numel() * loc.element_size()
    return total
