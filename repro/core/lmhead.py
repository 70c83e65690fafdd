"""The language-model head, shared by training and by every selector that scores examples.

- `weighted_lm_loss`: the trainer's loss (and the selectors' brief training).
- `head_chunks`: ONE scoring pass for CluSTER's gradient-proxy features (method/features.py) and
  the baselines' per-example loss and EL2N (baselines/common.py `forward_stats`). It runs the
  transformer body once for the last hidden state only, then the LM head only at labelled
  positions, `chunk_rows` rows at a time, into float32 logits, so it never holds [B, T, V] logits
  nor every layer's hidden states. Each caller turns a chunk's logits into its own numbers.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from repro.core.tokens import IGNORE_INDEX


def weighted_lm_loss(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, per_example: bool = False
) -> torch.Tensor:
    """Next-token loss over response tokens, each example's tokens scaled by its weight.

    Token mean (default): sum_i w_i * sum_t loss_it / sum_i n_i (n_i = response tokens of example
    i); with all w_i = w this is w times the usual mean token loss of the batch. per_example: each
    example's own token mean, summed, sum_i w_i * (sum_t loss_it / n_i); the two agree for a
    batch of one example (the trainer divides either by its normalizer: repro/core/steps.py).
    """
    logits = logits[:, :-1].float()
    targets = labels[:, 1:]
    tok = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(targets.shape)
    mask = targets != IGNORE_INDEX
    per_example_sum = (tok * mask).sum(dim=1)
    w = weights.to(per_example_sum.dtype)
    if per_example:
        return (w * per_example_sum / mask.sum(dim=1).clamp(min=1)).sum()
    return (w * per_example_sum).sum() / mask.sum().clamp(min=1)


# ----------------------------------------------------------------------------- the scoring pass


def core_model(model: Any) -> Any:
    """The plain causal LM inside DDP and peft wrappers (its config, body and head live there)."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    return model.get_base_model() if hasattr(model, "get_base_model") else model  # peft


def autocast(device: torch.device, bf16: bool | None) -> torch.autocast:
    """bfloat16 autocast when `bf16` (None: when the device is CUDA); a no-op context otherwise."""
    on = device.type == "cuda" if bf16 is None else bf16
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=on)


def labelled_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets, mask), both [B, T-1]: the hidden state at t predicts targets[:, t] = labels[:, t+1],
    and mask marks the positions whose target is a label (not IGNORE_INDEX)."""
    targets = labels[:, 1:]
    return targets, targets != IGNORE_INDEX


def head_is_last(model: Any) -> bool:
    """Whether the LM head's Linear output IS the logits. Not so where the model transforms them
    after the head (Gemma-2's final_logit_softcapping, Cohere's logit_scale): there only the
    model's own forward gives the right probabilities."""
    cfg = core_model(model).config
    return not (getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None))


class HeadWorkspace:
    """A reusable fp32 buffer for the LM head's chunk of logits ([rows, V]).

    A fresh 1024 x 49152 fp32 tensor (192 MiB) is a fresh mmap on CPU: the kernel zero-fills and
    page-faults it on every chunk of every batch (docs/measurements.md: the cost measured). A loop over
    many batches passes one workspace to every `head_chunks` call, so the buffer is faulted in
    once. It grows to the largest chunk asked for, never beyond `chunk_rows` rows.
    """

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def get(self, rows: int, vocab: int, device: torch.device) -> torch.Tensor:
        b = self._buf
        if b is None or b.device != device or b.shape[1] != vocab or b.shape[0] < rows:
            self._buf = b = None  # drop the old one before allocating the new one
            self._buf = b = torch.empty(rows, vocab, dtype=torch.float32, device=device)
        return b[:rows]


def _head_logits(
    head: Any, hc: torch.Tensor, device: torch.device, bf16: bool | None, workspace: HeadWorkspace | None
) -> torch.Tensor:
    """fp32 logits [rows, V] of the LM head for hidden rows `hc`, written into the workspace when
    one is given and the head is a plain fp32 Linear without autocast (the CPU path)."""
    autocast_on = device.type == "cuda" if bf16 is None else bf16
    w = getattr(head, "weight", None)
    if (
        workspace is not None
        and not autocast_on
        and isinstance(head, torch.nn.Linear)
        and w is not None
        and w.dtype == torch.float32
        and hc.dtype == torch.float32
    ):
        out = workspace.get(hc.shape[0], w.shape[0], device)
        torch.mm(hc, w.t(), out=out)
        if head.bias is not None:
            out.add_(head.bias)
        return out
    with autocast(device, bf16):
        logits = head(hc)
    return logits.float()  # a new fp32 tensor under bf16; on CPU fp32 the head's own output


class HeadChunk(NamedTuple):
    """Up to `chunk_rows` labelled positions of a batch, in row-major order."""

    rows: torch.Tensor  # [m] int64: the batch row of each position
    hidden: torch.Tensor  # [m, H]: the last hidden state there (the head's input, after the norm)
    targets: torch.Tensor  # [m] int64: the label it predicts
    logits: torch.Tensor  # [m, V] float32; may be a reused buffer: use it before the next chunk


def head_chunks(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    chunk_rows: int = 1024,
    *,
    bf16: bool | None = None,
    workspace: HeadWorkspace | None = None,
) -> Iterator[HeadChunk]:
    """The LM head at every labelled position of a batch ([B, T] tensors on the model's device),
    `chunk_rows` positions at a time (`labelled_positions`; a row may have none).

    The extra working memory is about chunk_rows * V * 4 bytes (1024 rows x 49152 vocab =
    192 MiB) instead of B * T * V * 4 for full logits. The body runs only up to the last column
    that holds a labelled position (causal attention: outputs at t depend on inputs <= t only, so
    the columns after it change nothing). `bf16`: autocast to bfloat16 (None: on CUDA).
    `workspace`: a `HeadWorkspace` reused across calls, so the logits of every chunk land in one
    buffer (see there; a consumer may overwrite them in place); None: fresh logits per chunk.
    A model whose head is not last (`head_is_last`) runs its own full forward instead (with a
    warning), its logits then taken chunk by chunk the same way.
    """
    if chunk_rows < 1:  # here, not at the first chunk: a generator's body starts late
        raise ValueError(f"chunk_rows: expected >= 1, got {chunk_rows}")
    return _chunks(model, input_ids, attention_mask, labels, chunk_rows, bf16, workspace)


@torch.no_grad()  # torch applies it around each step of a generator, not across its yields
def _chunks(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    chunk_rows: int,
    bf16: bool | None,
    workspace: HeadWorkspace | None,
) -> Iterator[HeadChunk]:
    core = core_model(model)
    device = next(core.parameters()).device
    targets, mask = labelled_positions(labels)
    rows, pos = mask.nonzero(as_tuple=True)
    if rows.numel() == 0:
        return
    y = targets[rows, pos]
    if not head_is_last(core):
        warnings.warn(
            f"{type(core).__name__} transforms logits after the LM head; scoring with "
            "its full forward ([B, T, V] logits)",
            stacklevel=2,
        )
        with autocast(device, bf16):
            out = model(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False
            )
        h = out.hidden_states[-1][:, :-1][rows, pos]  # the last entry is the final-norm output
        full = out.logits[:, :-1][rows, pos]
        del out
        for s in range(0, y.numel(), chunk_rows):
            yield HeadChunk(
                rows[s : s + chunk_rows],
                h[s : s + chunk_rows],
                y[s : s + chunk_rows],
                full[s : s + chunk_rows].float(),
            )
        return
    head = core.get_output_embeddings()
    t_need = int(pos.max()) + 1  # h_t for t < T-1 predicts labels[t+1]: columns 0..t_need-1
    with autocast(device, bf16):
        hidden = core.get_decoder()(
            input_ids=input_ids[:, :t_need], attention_mask=attention_mask[:, :t_need], use_cache=False
        ).last_hidden_state  # [B, t_need, H]
    h = hidden[rows, pos]  # [M, H]: only these rows ever meet the head
    del hidden
    for s in range(0, y.numel(), chunk_rows):
        hc = h[s : s + chunk_rows]
        yield HeadChunk(
            rows[s : s + chunk_rows],
            hc,
            y[s : s + chunk_rows],
            _head_logits(head, hc, device, bf16, workspace),
        )
