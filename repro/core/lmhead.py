"""The language-model loss the trainer and the selectors' brief training share."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def weighted_lm_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Token-mean next-token loss over response tokens, each example's tokens scaled by its weight.

    sum_i w_i * sum_t loss_it / sum_i n_i (n_i = response tokens of example i). With all w_i = w
    this is w times the usual mean token loss.
    """
    logits = logits[:, :-1].float()
    targets = labels[:, 1:]
    tok = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                          ignore_index=-100, reduction="none").view(targets.shape)
    mask = targets != -100
    per_example = (tok * mask).sum(dim=1)
    return (weights.to(per_example.dtype) * per_example).sum() / mask.sum().clamp(min=1)
