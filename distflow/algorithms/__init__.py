"""RL algorithms as pure tensor functions: advantages, reward shaping, losses, KL and entropy.

No distributed code and no Megatron imports: workers call these per micro-batch on local tensors, and the
tests check them against hand-computed numbers.
"""

from distflow.algorithms.advantages import (
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from distflow.algorithms.aggregation import (
    LOSS_AGG_MODES,
    aggregate,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from distflow.algorithms.entropy import entropy_from_logits
from distflow.algorithms.estimators import ESTIMATOR_FUNCTIONS, compute_advantages
from distflow.algorithms.groups import filter_groups_with_variance, group_index, group_statistics
from distflow.algorithms.kl import KL_ESTIMATORS, kl_divergence
from distflow.algorithms.policy_loss import gspo_loss, policy_loss, ppo_clip_loss
from distflow.algorithms.reward_shaping import apply_kl_penalty, outcome_token_rewards, overlong_penalty
from distflow.algorithms.value_loss import value_loss

__all__ = [
    "ESTIMATOR_FUNCTIONS",
    "LOSS_AGG_MODES",
    "KL_ESTIMATORS",
    "aggregate",
    "apply_kl_penalty",
    "compute_advantages",
    "discounted_returns",
    "entropy_from_logits",
    "filter_groups_with_variance",
    "gae_advantages",
    "grpo_advantages",
    "group_index",
    "group_statistics",
    "gspo_loss",
    "kl_divergence",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "outcome_token_rewards",
    "overlong_penalty",
    "policy_loss",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "value_loss",
]
