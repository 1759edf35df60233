"""Actor losses: the PPO clipped surrogate (clip-higher, dual-clip), GSPO, and `policy_loss`, the config entry.

Inputs are padded [batch, seq] tensors: `logprob` (current policy, carries the gradient), `old_logprob` (the
policy that sampled, or the one before this update: no gradient), `advantages` (no gradient) and
`response_mask` (1 on response tokens that count). Every loss returns (scalar loss, metrics); metrics are
detached 0-d tensors (no device sync here) and always token-level means over the mask, whatever the
aggregation mode of the loss.
"""

from typing import Optional

import torch

from distflow.algorithms.aggregation import aggregate, masked_mean
from distflow.algorithms.kl import kl_divergence
from distflow.algorithms.rollout_correction import correction_weights

# exp() of the log-ratio overflows float32 above ~88, and inf * 0-advantage is NaN. +-20 (ratio within
# [2e-9, 5e8]) is far outside every clip range, so clamping changes no loss value that clipping keeps.
LOG_RATIO_BOUND = 20.0


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_ratio_low: float, clip_ratio_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token max(-A r, -A clip(r, 1 - low, 1 + high)) and where the clipped branch is the larger."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def ppo_clip_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: Optional[float] = 3.0,
    loss_agg_mode: str = "token-mean",
    token_weights: Optional[torch.Tensor] = None,
):
    """PPO's clipped surrogate with asymmetric clip range (DAPO clip-higher) and dual-clip.

    Per token, r = exp(logprob - old_logprob):
      loss = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)),
      and where A < 0 also capped at -A * clip_ratio_c (dual-clip: a token whose ratio exploded under a
      negative advantage cannot push an unbounded update). `clip_ratio_c=None` disables dual-clip.
      `token_weights` (no gradient): each token's loss times its weight (rollout correction's importance
      weights and mask, rollout_correction.py), the aggregation's denominators unchanged.
    Returns (aggregate(loss, mask, loss_agg_mode), metrics) with metrics
      pg_clipfrac        fraction of tokens where the clipped branch is active,
      pg_clipfrac_lower  fraction where the dual-clip cap is active (A < 0),
      ppo_kl             mean of old_logprob - logprob (approximate KL(old || new)),
      ratio_mean         mean ratio.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(
            f"clip_ratio_c must be > 1 (it caps -A * r above the clipped loss), got {clip_ratio_c}"
        )
    log_ratio = logprob - old_logprob
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    token_loss, clipped = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)

    dual_clipped = torch.zeros_like(clipped)
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        dual_clipped = (advantages < 0) & (token_loss > cap)
        token_loss = torch.where(dual_clipped, cap, token_loss)
    if token_weights is not None:
        token_loss = token_loss * token_weights

    metrics = {
        "pg_clipfrac": masked_mean(clipped.to(ratio.dtype), response_mask),
        "pg_clipfrac_lower": masked_mean(dual_clipped.to(ratio.dtype), response_mask),
        "ppo_kl": masked_mean(-log_ratio, response_mask),
        "ratio_mean": masked_mean(ratio, response_mask),
    }
    return aggregate(token_loss, response_mask, loss_agg_mode), {k: v.detach() for k, v in metrics.items()}


def gspo_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
    token_weights: Optional[torch.Tensor] = None,
):
    """GSPO (Group Sequence Policy Optimization): PPO clipping on a sequence-level importance ratio.

    Sequence ratio s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean over the response tokens of
    logprob - old_logprob). Token-level form: s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)] (sg: stop-gradient),
    whose value is s_i for every token and whose gradient is s_i * grad log pi(y_t); with
    seq-mean-token-mean aggregation and a per-sequence advantage this is exactly GSPO's sequence objective,
    and per-token advantages remain possible. Each token's loss is max(-A s_i,t, -A clip(s_i,t, 1 - low,
    1 + high)); the ranges are small (3e-4 / 4e-4 in the paper) because s_i is a geometric mean. No dual-clip
    (GSPO defines none). `token_weights` as in `ppo_clip_loss`. Returns (loss, metrics) with the keys of
    `ppo_clip_loss` (pg_clipfrac_lower is 0).
    """
    token_log_ratio = logprob - old_logprob
    sequence_log_ratio = masked_mean(token_log_ratio, response_mask, dim=-1).unsqueeze(-1)
    log_ratio = sequence_log_ratio.detach() + logprob - logprob.detach()
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    token_loss, clipped = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    if token_weights is not None:
        token_loss = token_loss * token_weights

    metrics = {
        "pg_clipfrac": masked_mean(clipped.to(ratio.dtype), response_mask),
        "pg_clipfrac_lower": torch.zeros((), dtype=ratio.dtype, device=ratio.device),
        "ppo_kl": masked_mean(-token_log_ratio, response_mask),
        "ratio_mean": masked_mean(ratio, response_mask),
    }
    return aggregate(token_loss, response_mask, loss_agg_mode), {k: v.detach() for k, v in metrics.items()}


def policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config,
    entropy: Optional[torch.Tensor] = None,
    ref_logprob: Optional[torch.Tensor] = None,
    rollout_logprob: Optional[torch.Tensor] = None,
):
    """The actor's full loss as configured by `config` (an `AlgorithmConfig`, or anything with its fields).

    loss = pg_loss - entropy_coef * aggregate(entropy) + kl_coef * aggregate(kl(logprob, ref_logprob))
    with the policy-gradient term chosen by `config.policy_loss` (ppo | gspo), every term aggregated with
    `config.loss_agg_mode`, and the KL term left out when `config.kl_in_reward` (the penalty is then in the
    rewards, see `reward_shaping.apply_kl_penalty`). `entropy` [batch, seq] is the per-token entropy the
    worker computed (vocab-parallel); needed when entropy_coef != 0. `ref_logprob` is needed when the KL term
    is on. With `config.rollout_correction` on, `old_logprob` is the proximal policy and `rollout_logprob`
    (the engine's, the behaviour policy) is needed: the policy-gradient term is weighed per token by
    rollout_correction.correction_weights (decoupled PPO with truncated and/or masked importance sampling).
    Returns (loss, metrics): pg_loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl, ratio_mean, plus entropy when
    `entropy` is given, kl when `ref_logprob` is given (reported even when not in the loss), and
    rollout_corr/is_weight_mean, rollout_corr/is_weight_max, rollout_corr/masked_fraction with a correction.
    Called by the actor worker once per micro-batch.
    """
    mode = config.loss_agg_mode
    weights, correction = None, {}
    rc = getattr(config, "rollout_correction", None)
    if rc is not None and rc.enabled:
        if rollout_logprob is None:
            raise ValueError("algorithm.rollout_correction needs the engine's `rollout_logprob`")
        weights, stats = correction_weights(
            old_logprob,
            rollout_logprob,
            response_mask,
            rc.is_level,
            rc.is_cap,
            rc.mask_level,
            rc.mask_low,
            rc.mask_high,
        )
        correction = {f"rollout_corr/{k}": v for k, v in stats.items()}
    if config.policy_loss == "ppo":
        pg_loss, metrics = ppo_clip_loss(
            logprob,
            old_logprob,
            advantages,
            response_mask,
            config.clip_ratio_low,
            config.clip_ratio_high,
            config.clip_ratio_c,
            mode,
            weights,
        )
    elif config.policy_loss == "gspo":
        pg_loss, metrics = gspo_loss(
            logprob,
            old_logprob,
            advantages,
            response_mask,
            config.clip_ratio_low,
            config.clip_ratio_high,
            mode,
            weights,
        )
    else:
        raise ValueError(f"unknown policy_loss {config.policy_loss!r}; valid: ppo, gspo")
    metrics = {"pg_loss": pg_loss.detach(), **metrics, **correction}
    loss = pg_loss

    if config.entropy_coef != 0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs the per-token `entropy`")
    if entropy is not None:
        entropy_term = aggregate(entropy, response_mask, mode)
        metrics["entropy"] = entropy_term.detach()
        if config.entropy_coef != 0:
            loss = loss - config.entropy_coef * entropy_term

    kl_in_loss = config.kl_coef != 0 and not config.kl_in_reward
    if kl_in_loss and ref_logprob is None:
        raise ValueError("kl_coef != 0 with kl_in_reward=False needs `ref_logprob`")
    if ref_logprob is not None:
        kl_term = aggregate(kl_divergence(logprob, ref_logprob, config.kl_estimator), response_mask, mode)
        metrics["kl"] = kl_term.detach()
        if kl_in_loss:
            loss = loss + config.kl_coef * kl_term
    return loss, metrics
