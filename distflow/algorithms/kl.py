"""Per-token estimators of KL(policy || reference) from the log-probs of tokens sampled from the policy.

With log r = ref_logprob - logprob (r = pi_ref / pi on the sampled token):
  k1 = -log r                  unbiased, high variance, can be negative per token;
  k2 = 0.5 (log r)^2           biased, low variance, >= 0;
  k3 = r - 1 - log r           unbiased and >= 0 per token, low variance (Schulman's "k3").
All three are exactly 0 where logprob == ref_logprob, so the first step's KL is exactly 0.
"""

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")

# exp() overflows float32 above ~88; 20 keeps r within [2e-9, 5e8], far past any ratio that trains well.
LOG_RATIO_BOUND = 20.0
# k3 grows like exp(log r): one token the policy has nearly abandoned would otherwise dominate the loss and its
# gradient. Tokens past the bound contribute a constant (no gradient), as in common PPO/GRPO recipes.
K3_BOUND = 10.0


def kl_divergence(logprob: torch.Tensor, ref_logprob: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate, same shape as the inputs; callers mask and aggregate it.

    `logprob`: log-probs of the sampled tokens under the policy; `ref_logprob`: under the reference model.
    Unknown `estimator` -> ValueError naming the valid ones.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; valid estimators: {', '.join(KL_ESTIMATORS)}")
    log_ratio = ref_logprob - logprob
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    # expm1 keeps precision near r = 1, where exp(x) - 1 would cancel; the lower clamp at 0 only removes
    # rounding error, as r - 1 - log r >= 0 exactly.
    return (torch.expm1(log_ratio) - log_ratio).clamp(0.0, K3_BOUND)
