"""Rollout correction: the engine that sampled (the behaviour policy mu: its kernels, its precision, its
weights' age) is not the policy the trainer computes, so the samples are off-policy. These functions weigh
or mask each token by how far the two disagree, and measure the disagreement.

Three policies take part, as [batch, seq] log-probs over the same tokens:
  behaviour  mu:      the engine's log-probs of what it sampled (the samples' rollout_logprobs);
  proximal   pi_prox: the trainer's policy before this update (the old-log-prob pass, or the update's own
                      forward, detached, when one update uses the batch);
  current    pi:      the policy being updated (carries the gradient).
With a correction on, the PPO ratio is pi / pi_prox (its clip keeps the update near the proximal policy)
and each token's loss is weighed by w = pi_prox / mu, truncated at a cap (TIS), and/or dropped when w leaves
[low, high] (masked importance sampling, IcePop-style): decoupled PPO, which corrects an asynchronous run for
both the policy's age and the engine's numerics. At sequence level the weight is the product of a sequence's
token ratios (the exact sequence IS weight) and the mask tests their geometric mean (a length-fair test).
All pure tensor functions; nothing here has parameters.
"""

import torch

from distflow.algorithms.aggregation import masked_mean

# exp() of a summed sequence log-ratio overflows float32 above ~88; weights beyond e^20 are capped anyway.
LOG_RATIO_BOUND = 20.0
LEVELS = ("none", "token", "sequence")


def correction_weights(
    proximal: torch.Tensor,
    behaviour: torch.Tensor,
    mask: torch.Tensor,
    is_level: str = "none",
    is_cap: float = 2.0,
    mask_level: str = "none",
    mask_low: float = 0.5,
    mask_high: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss weights [batch, seq] (detached; 0 off the mask) and their metrics.

    is_level token: w_t = min(pi_prox(y_t) / mu(y_t), is_cap); sequence: every token of sequence i gets
    min(prod_t pi_prox / mu, is_cap); none: 1. mask_level token: tokens whose ratio pi_prox / mu is outside
    [mask_low, mask_high] get weight 0; sequence: every token of a sequence whose geometric-mean ratio is
    outside gets 0; none: no mask. Metrics (detached 0-d, over the mask): is_weight_mean, is_weight_max (the
    truncated weights before masking), masked_fraction (tokens given weight 0 by the mask).
    """
    _check(is_level, is_cap, mask_level, mask_low, mask_high)
    mask = mask.to(proximal.dtype)
    log_ratio = ((proximal - behaviour) * mask).detach()
    token_ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    if is_level == "token":
        weights = token_ratio.clamp(max=is_cap)
    elif is_level == "sequence":
        sequence_log_ratio = log_ratio.sum(dim=-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        weights = torch.exp(sequence_log_ratio).clamp(max=is_cap).expand_as(log_ratio)
    else:
        weights = torch.ones_like(log_ratio)
    weights = weights * mask
    keep = torch.ones_like(log_ratio)
    if mask_level == "token":
        keep = ((token_ratio >= mask_low) & (token_ratio <= mask_high)).to(log_ratio.dtype)
    elif mask_level == "sequence":
        geometric = torch.exp(masked_mean(log_ratio, mask, dim=-1)).unsqueeze(-1)
        keep = ((geometric >= mask_low) & (geometric <= mask_high)).to(log_ratio.dtype).expand_as(log_ratio)
    on = mask > 0
    metrics = {
        "is_weight_mean": masked_mean(weights, mask),
        "is_weight_max": weights[on].max() if on.any() else torch.zeros((), dtype=weights.dtype),
        "masked_fraction": masked_mean(1.0 - keep, mask),
    }
    return weights * keep, metrics


def mismatch_metrics(
    trainer: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the engine's log-probs (behaviour) are from the trainer's on the same tokens (detached 0-d):
    logprob_abs_diff (mean |trainer - behaviour| per token) and logprob_abs_diff_max; kl, the k3 estimate
    of KL(mu || pi_trainer) from the engine's own samples (r - 1 - log r with r = pi / mu, >= 0 per token);
    ppl_ratio, the trainer's perplexity of the responses over the engine's (exp of the mean per-token
    log-prob gap; 1 when they agree)."""
    mask = mask.to(trainer.dtype)
    diff = ((trainer - behaviour) * mask).detach()
    log_r = diff.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    on = mask > 0
    return {
        "logprob_abs_diff": masked_mean(diff.abs(), mask),
        "logprob_abs_diff_max": diff.abs()[on].max() if on.any() else torch.zeros((), dtype=diff.dtype),
        "kl": masked_mean(torch.exp(log_r) - 1.0 - log_r, mask),
        "ppl_ratio": torch.exp(-masked_mean(diff, mask)),
    }


def _check(is_level: str, is_cap: float, mask_level: str, low: float, high: float) -> None:
    if is_level not in LEVELS or mask_level not in LEVELS:
        bad = is_level if is_level not in LEVELS else mask_level
        raise ValueError(f"rollout correction level {bad!r}; valid: {', '.join(LEVELS)}")
    if is_level != "none" and not is_cap > 0:
        raise ValueError(f"is_cap={is_cap} must be > 0 (the largest importance weight kept)")
    if mask_level != "none" and not 0 <= low < high:
        raise ValueError(f"mask_low={low} and mask_high={high} must satisfy 0 <= low < high")
