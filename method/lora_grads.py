"""Exact per-example LoRA gradients from ONE batched forward/backward, randomly projected.

Features for CluSTER ablations and the LESS baseline (Xia et al. 2024): for each example, the
gradient of its OWN mean token loss (response tokens only, as `repro.core.lmhead.weighted_lm_loss`
computes it for a batch of one) w.r.t. every LoRA weight, optionally Adam-preconditioned, then
projected to d dims by a Rademacher matrix that is regenerated block by block, never stored.

Why hooks: for a Linear y = x W^T (+ b), the gradient of a sum of per-example losses w.r.t. the
activations of example b depends only on example b's own loss (no op mixes examples in a causal LM),
so grad_W(example b) = sum_t gy[b,t]^T x[b,t]: one einsum per LoRA module, about the cost of one
batched backward (a loop of batch-1 backwards is slower: docs/measurements.md). Padding positions
have their loss masked, so their gy is exactly 0.

Sizes: SmolLM2-135M, LoRA r=8 on q_proj, v_proj: P = 460,800 LoRA weights, 1.8 MB per example in
fp32; a stored 460,800 x 8192 fp32 projection would be 15 GB, one 4096-row block is 128 MiB.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
# Flat gradients buffered before each projection call. Generating R costs the same whatever the
# number of rows projected (docs/measurements.md gives the cost), so project many at once.
BUFFER_BYTES = 1 << 30


def _unwrap(model):
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def per_example_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[B] mean next-token cross-entropy (nats/token) over each example's response tokens.

    logits [B, T, V], labels [B, T] with -100 on prompt and padding positions. An example with no
    response token gets 0. Each row equals `weighted_lm_loss` on that example alone, weight 1.
    """
    logits = logits[:, :-1].float()
    targets = labels[:, 1:].to(logits.device)
    tok = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(targets.shape)
    mask = targets != IGNORE_INDEX
    return (tok * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


class PerExampleLoraGrads:
    """Context manager / helper that installs forward and backward hooks on every peft LoRA layer's
    lora_A and lora_B Linear modules of a peft model, so that one batched backward of the SUM of
    per-example losses yields each example's gradient for every LoRA weight: for a Linear y = x W^T,
    grad_W(example b) = sum_t gy[b,t]^T x[b,t] -> one einsum per layer ('bto,bti->boi').
    Padding positions contribute zero (their loss is masked).

    `param_names`: the LoRA parameters covered, in `model.named_parameters()` order (the order of
    `repro.core.models.trainable_state_dict` and of the trainer's optimizer when only LoRA is trainable);
    `flat` concatenates them in this order, each flattened row-major. `num_params` = P.
    Hooks capture only inside `per_example_grads`, so the model can be used normally meanwhile;
    `close()` (or leaving the `with` block) removes them. Parameter .grad fields are not touched.
    """

    def __init__(self, model):
        from peft.tuners.lora import LoraLayer

        self.model = model
        base = _unwrap(model)
        name_of = {id(p): n for n, p in base.named_parameters()}
        owner: dict[str, torch.nn.Linear] = {}  # parameter name -> the LoRA Linear holding it
        for mname, mod in base.named_modules():
            if not isinstance(mod, LoraLayer):
                continue
            if getattr(mod, "lora_variant", None) or any(getattr(mod, "use_dora", {}).values()):
                raise NotImplementedError(
                    f"{mname}: LoRA variants (DoRA, ...) are not supported; "
                    "their forward is not lora_B(lora_A(x)) * scaling"
                )
            for a in mod.active_adapters:
                for sub in (mod.lora_A[a], mod.lora_B[a]) if a in mod.lora_A else ():
                    if type(sub) is not torch.nn.Linear:
                        raise NotImplementedError(
                            f"{mname}: only Linear LoRA modules are supported, got {type(sub).__name__}"
                        )
                    for p in sub.parameters(recurse=False):
                        if p.requires_grad:
                            owner[name_of[id(p)]] = sub
        if not owner:
            raise ValueError("no trainable peft LoRA Linear modules found in the model")
        params = dict(base.named_parameters())
        self.param_names = [n for n in params if n in owner]  # named_parameters() order
        self._params = [params[n] for n in self.param_names]
        self.shapes = {n: tuple(params[n].shape) for n in self.param_names}
        self.num_params = sum(p.numel() for p in self._params)
        self._names: dict[torch.nn.Linear, tuple[str | None, str | None]] = {}
        for n in self.param_names:
            w, b = self._names.get(owner[n], (None, None))
            self._names[owner[n]] = (n, b) if n.endswith("weight") else (w, n)
        self._active = False
        self._acc: dict[str, torch.Tensor] = {}
        self._handles = [m.register_forward_hook(self._forward_hook) for m in self._names]

    def __enter__(self) -> PerExampleLoraGrads:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _forward_hook(self, mod, inputs, out) -> None:
        if not self._active or not out.requires_grad:
            return
        x = inputs[0].detach()
        # A hook on this call's OUTPUT (not a module backward hook): it fires once per call with gy
        # for that call, so a module called twice per forward would still be summed correctly.
        out.register_hook(lambda gy: self._accumulate(mod, x, gy))

    def _accumulate(self, mod, x: torch.Tensor, gy: torch.Tensor) -> None:
        b = x.shape[0]
        x = x.reshape(b, -1, x.shape[-1]).float()  # [B, T, in]
        gy = gy.reshape(b, -1, gy.shape[-1]).float()  # [B, T, out]
        wname, bname = self._names[mod]
        for name, g in ((wname, lambda: torch.einsum("bto,bti->boi", gy, x)), (bname, lambda: gy.sum(dim=1))):
            if name is not None:
                self._acc[name] = self._acc[name] + g() if name in self._acc else g()

    def per_example_grads(self, batch: dict) -> dict[str, torch.Tensor]:
        """name -> [B, *param.shape] fp32: gradient of each example's `per_example_loss`.

        batch: `repro.core.data.collate` output (input_ids, labels, attention_mask: [B, T] int64).
        """
        dev = self._params[0].device
        labels = batch["labels"].to(dev)
        mask = batch.get("attention_mask")
        self._acc = {}
        try:
            with torch.enable_grad():
                self._active = True
                logits = self.model(
                    input_ids=batch["input_ids"].to(dev),
                    use_cache=False,
                    attention_mask=None if mask is None else mask.to(dev),
                ).logits
                self._active = False
                # d(sum_b loss_b)/d(activations of b) = d loss_b / d(activations of b).
                total = torch.autograd.grad(
                    per_example_loss(logits, labels).sum(), self._params, allow_unused=True
                )
        finally:
            self._active = False
        bsz = labels.shape[0]
        out = {n: self._acc.pop(n, None) for n in self.param_names}
        for (n, g), t in zip(out.items(), total):
            if g is None:  # module unused in this forward: zero gradient
                out[n] = g = torch.zeros((bsz, *self.shapes[n]), device=dev)
            # Guard against a peft code path that bypasses the hooked modules: the per-example
            # grads must sum to autograd's gradient of the summed loss (cheap: LoRA is small).
            t = torch.zeros_like(g[0]) if t is None else t.float()
            if (g.sum(0) - t).norm() > 1e-3 * t.norm() + 1e-6:
                raise RuntimeError(
                    f"per-example gradients of {n} do not sum to the batch "
                    "gradient: a LoRA module was called outside the hooked forward"
                )
        return out

    def flat(self, batch: dict) -> torch.Tensor:
        """[B, P] fp32: `per_example_grads` concatenated in `param_names` order, each row-major."""
        g = self.per_example_grads(batch)
        return torch.cat([g[n].reshape(g[n].shape[0], -1) for n in self.param_names], dim=1)


class RademacherProjector:
    """x [B, P] -> x @ R / sqrt(d), R in {-1,+1}^{P x d}, generated BLOCK BY BLOCK from a seeded
    torch.Generator (rows of R in blocks of `block_rows`, each block seeded by (seed, block index)),
    so an 8192-dim projection of a 460,800-dim gradient never holds R in memory (15 GB in fp32).
    Same seed -> same R, independent of batch size and of how many examples are projected at once.

    Block k (rows k*block_rows ...) comes from a CPU generator seeded with blake2b(seed, k) as
    ceil(d/8) random bytes per row, each byte giving 8 signs (bit j -> column 8*i+j, 1 -> +1,
    0 -> -1). The bytes are made on CPU whatever the device of x, so R is the same on CPU and GPU;
    they are unpacked on x's device. R depends on (seed, out_dim, block_rows), not on in_dim (R for
    a smaller P is a prefix). E[<Rx, Ry>] / d = <x, y>. Peak extra memory: block_rows*d*(4 + 4)
    bytes (256 MiB at 4096 x 8192, fp32). Generation dominates on CPU (docs/measurements.md), so
    project many rows per call.
    """

    def __init__(self, in_dim: int, out_dim: int, seed: int, block_rows: int = 4096, dtype=torch.float32):
        if in_dim < 1 or out_dim < 1 or block_rows < 1:
            raise ValueError(
                f"in_dim, out_dim, block_rows must be >= 1; got {in_dim}, {out_dim}, {block_rows}"
            )
        self.in_dim, self.out_dim, self.seed = in_dim, out_dim, int(seed)
        self.block_rows, self.dtype = block_rows, dtype
        self._lut: dict[torch.device, torch.Tensor] = {}

    def block(self, k: int, device="cpu") -> torch.Tensor:
        """Rows [k*block_rows, min((k+1)*block_rows, in_dim)) of R, [rows, d] in self.dtype."""
        lo, hi = k * self.block_rows, min((k + 1) * self.block_rows, self.in_dim)
        seed = (
            int.from_bytes(hashlib.blake2b(f"{self.seed},{k}".encode(), digest_size=8).digest(), "little")
            >> 1
        )  # manual_seed wants < 2**63
        g = torch.Generator(device="cpu").manual_seed(seed)
        nbytes = -(-self.out_dim // 8)
        raw = torch.randint(0, 256, (hi - lo, nbytes), generator=g, dtype=torch.uint8)
        device = torch.device(device)
        if device not in self._lut:  # byte value -> its 8 signs, [256, 8]
            bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
            self._lut[device] = (bits * 2 - 1).to(device=device, dtype=self.dtype)
        signs = self._lut[device].index_select(0, raw.to(device).reshape(-1).int())
        return signs.view(hi - lo, nbytes * 8)[:, : self.out_dim]

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """[B, in_dim] -> [B, out_dim] in self.dtype, on x's device."""
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"expected x of shape [B, {self.in_dim}], got {tuple(x.shape)}")
        out = torch.zeros(x.shape[0], self.out_dim, device=x.device, dtype=self.dtype)
        for k in range(-(-self.in_dim // self.block_rows)):
            lo = k * self.block_rows
            out.addmm_(x[:, lo : lo + self.block_rows].to(self.dtype), self.block(k, x.device))
        return out.div_(math.sqrt(self.out_dim))


def adam_preconditioner(
    optimizer_state: dict, param_order: list[str], beta1=0.9, beta2=0.999, eps=1e-8, step=None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """LESS-style Adam preconditioning of per-example gradients: returns f(g [B, P]) -> [B, P].

    f(g) = m_hat / (sqrt(v_hat) + eps), where, per coordinate,
        m = beta1 * exp_avg + (1 - beta1) * g,     m_hat = m / (1 - beta1**step)
        v = beta2 * exp_avg_sq + (1 - beta2) * g**2, v_hat = v / (1 - beta2**step)
    i.e. the Adam update one more step on this example alone would take (up to -lr; AdamW's
    decoupled weight decay does not depend on g and is left out). step=None: the state's "step"
    + 1 (the update g would make); step=0: no bias correction, as LESS's released code does
    (which also puts eps inside the sqrt: sqrt(v + eps); a small difference once v >> eps).

    optimizer_state, either
      - a torch optimizer `state_dict()` (e.g. torch.load of a checkpoint's optimizer.pt): its
        parameters, in param_groups order, are named by `param_order`, which must list them all.
        For the trainer's optimizer (built over the requires_grad parameters in named_parameters
        order) that is `list(repro.core.models.trainable_state_dict(model))`, which with LoRA only
        equals `PerExampleLoraGrads(model).param_names`;
      - or {name: {"exp_avg", "exp_avg_sq"[, "step"]}}: `param_order` picks and orders names.
    The flat g must be `param_order`'s parameters concatenated, each row-major (f.param_order
    holds it; `lora_gradient_features` checks it against the hooks' order).
    """
    if "state" in optimizer_state and "param_groups" in optimizer_state:
        ids = [i for group in optimizer_state["param_groups"] for i in group["params"]]
        if len(ids) != len(param_order):
            raise ValueError(
                f"optimizer state has {len(ids)} parameters, param_order names "
                f"{len(param_order)}; it must name every optimizer parameter in order"
            )
        for group in optimizer_state["param_groups"]:
            if "betas" in group and tuple(group["betas"]) != (beta1, beta2):
                raise ValueError(f"optimizer betas {tuple(group['betas'])} != ({beta1}, {beta2})")
        by_name = {n: optimizer_state["state"].get(i, {}) for n, i in zip(param_order, ids)}
    else:
        by_name = optimizer_state
    missing = [n for n in param_order if "exp_avg" not in by_name.get(n, {})]
    if missing:
        raise ValueError(
            f"no Adam moments for {len(missing)} parameters (e.g. {missing[:3]}); "
            "is this an AdamW state saved after at least one step?"
        )
    m0, v0 = (
        torch.cat([by_name[n][k].detach().float().reshape(-1).cpu() for n in param_order])
        for k in ("exp_avg", "exp_avg_sq")
    )
    if step is None:
        steps = {int(by_name[n]["step"]) for n in param_order if "step" in by_name[n]}
        if len(steps) != 1:
            raise ValueError(f"cannot infer the step from the optimizer state (found {steps}); pass step=")
        step = steps.pop() + 1
    c1 = 1 - beta1**step if step else 1.0
    c2 = 1 - beta2**step if step else 1.0
    cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def precondition(g: torch.Tensor) -> torch.Tensor:
        if g.shape[-1] != m0.numel():
            raise ValueError(f"gradient has {g.shape[-1]} coordinates, the optimizer state {m0.numel()}")
        if g.device not in cache:
            cache[g.device] = (m0.to(g.device), v0.to(g.device))
        m_s, v_s = cache[g.device]
        g = g.float()
        m = (beta1 * m_s + (1 - beta1) * g) / c1
        v = (beta2 * v_s + (1 - beta2) * g * g) / c2
        return m / (v.sqrt() + eps)

    precondition.param_order = list(param_order)
    return precondition


def lora_gradient_features(
    model,
    tokenized_examples: list[dict],
    pad_token_id: int,
    batch_size: int,
    proj_dim: int,
    seed: int,
    preconditioner=None,
    progress=True,
) -> np.ndarray:
    """[N, proj_dim] float32, in input order: projected (optionally preconditioned) per-example
    LoRA gradients of each example's mean response-token loss.

    tokenized_examples: `repro.core.data.tokenize_example` dicts (input_ids, labels). Examples are
    batched by length (less padding; results do not depend on batch composition) and the model
    is put in eval mode (no dropout) for the call. Flat gradients are buffered up to BUFFER_BYTES
    (on the model's device) between projections. Not normalized: LESS takes cosine similarity.
    """
    from repro.core.log import progress_bar
    from repro.core.tokens import collate

    n = len(tokenized_examples)
    out = np.zeros((n, proj_dim), dtype=np.float32)
    if n == 0:
        return out
    order = sorted(range(n), key=lambda i: -len(tokenized_examples[i]["input_ids"]))
    was_training = model.training
    model.eval()
    try:
        with PerExampleLoraGrads(model) as hooks:
            want = getattr(preconditioner, "param_order", None)
            if want is not None and list(want) != hooks.param_names:
                raise ValueError(
                    "preconditioner param_order differs from the LoRA parameter order "
                    f"({len(want)} vs {len(hooks.param_names)} names); build it with "
                    "param_order=PerExampleLoraGrads(model).param_names"
                )
            proj = RademacherProjector(hooks.num_params, proj_dim, seed)
            cap = max(batch_size, BUFFER_BYTES // (4 * hooks.num_params))
            buf: list[torch.Tensor] = []
            buf_idx: list[int] = []

            def flush() -> None:
                z = proj.project(torch.cat(buf))
                out[buf_idx] = z.float().cpu().numpy()
                buf.clear()
                buf_idx.clear()

            bar = progress_bar(total=n, desc="lora grads", unit="ex", enabled=progress)
            for s in range(0, n, batch_size):
                idx = order[s : s + batch_size]
                g = hooks.flat(collate([tokenized_examples[i] for i in idx], pad_token_id))
                buf.append(preconditioner(g) if preconditioner is not None else g)
                buf_idx.extend(idx)
                if len(buf_idx) + batch_size > cap:
                    flush()
                bar.update(len(idx))
            if buf:
                flush()
            bar.close()
    finally:
        model.train(was_training)
    return out
