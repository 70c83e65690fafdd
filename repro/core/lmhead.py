"""The language-model loss the trainer and the selectors' brief training share."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def weighted_lm_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                     per_example: bool = False) -> torch.Tensor:
    """Next-token loss over response tokens, each example's tokens scaled by its weight.

    Token mean (default): sum_i w_i * sum_t loss_it / sum_i n_i (n_i = response tokens of example
    i); with all w_i = w this is w times the usual mean token loss of the batch. per_example: each
    example's own token mean, summed, sum_i w_i * (sum_t loss_it / n_i); the two agree for a
    batch of one example (the trainer divides either by its normalizer: repro/core/steps.py).
    """
    logits = logits[:, :-1].float()
    targets = labels[:, 1:]
    tok = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                          ignore_index=-100, reduction="none").view(targets.shape)
    mask = targets != -100
    per_example_sum = (tok * mask).sum(dim=1)
    w = weights.to(per_example_sum.dtype)
    if per_example:
        return (w * per_example_sum / mask.sum(dim=1).clamp(min=1)).sum()
    return (w * per_example_sum).sum() / mask.sum().clamp(min=1)
