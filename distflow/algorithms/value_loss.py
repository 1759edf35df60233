"""The critic's loss: PPO's clipped value regression."""

from typing import Optional

import torch

from distflow.algorithms.aggregation import aggregate, masked_mean


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range: Optional[float] = 0.5,
    loss_agg_mode: str = "token-mean",
):
    """0.5 * max((v - R)^2, (v_clip - R)^2) per token, aggregated; v_clip = old + clamp(v - old, +-clip_range).

    `values` [batch, seq]: the critic's current predictions (carry the gradient); `old_values`: its
    predictions when the rollout was scored (no gradient); `returns`: the regression targets (e.g. GAE
    returns). Taking the max keeps the critic from moving a value further than `clip_range` from its old
    estimate in one update when that would lower the loss; `clip_range=None` disables clipping.
    Returns (loss, {"vf_loss", "vf_clipfrac"}): vf_clipfrac is the fraction of masked tokens where the
    clipped error is the larger one; metrics are detached.
    """
    unclipped_error = (values - returns).square()
    if clip_range is None:
        token_loss, clipped = unclipped_error, torch.zeros_like(unclipped_error, dtype=torch.bool)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
        clipped_error = (clipped_values - returns).square()
        token_loss, clipped = torch.maximum(unclipped_error, clipped_error), clipped_error > unclipped_error
    loss = 0.5 * aggregate(token_loss, response_mask, loss_agg_mode)
    return loss, {
        "vf_loss": loss.detach(),
        "vf_clipfrac": masked_mean(clipped.to(values.dtype), response_mask).detach(),
    }
