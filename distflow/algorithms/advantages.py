"""Advantage estimators: GRPO, RLOO, REINFORCE++ (with and without group baseline) and GAE.

Shapes: `rewards` [batch] are outcome rewards (one per sequence); `token_rewards` [batch, seq] are per-token
rewards aligned with `response_mask` [batch, seq] (see reward_shaping.py); `group_ids` labels each sample's
prompt group (groups.py). Advantages are [batch, seq], 0 off the mask, and carry no gradient.
Spread conventions: group std and batch whitening both use the unbiased (n - 1) estimate.
A group whose rewards are all equal gets advantage exactly 0 from every group estimator: its statistics are
computed in float64 and such groups are zeroed by an exact max == min test, because in float32 the mean of
[0.7] * 8 is one ulp off 0.7 and the std division turned that ulp into |advantage| ~0.06 of one sign.
Which estimator runs is a record of distflow.config.algorithm, its function in distflow.algorithms.estimators
(`compute_advantages` there dispatches on `algorithm.adv_estimator`); the DAG's advantage nodes are
distflow.nodes.advantage.
"""

import torch

from distflow.algorithms.aggregation import masked_whiten
from distflow.algorithms.groups import GroupIds, filter_groups_with_variance, group_statistics


def _broadcast(per_sequence: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[batch] -> [batch, seq]: the sequence's value on each of its response tokens, 0 elsewhere."""
    return torch.where(response_mask.bool(), per_sequence.unsqueeze(-1), 0)


def _as_float(rewards: torch.Tensor) -> torch.Tensor:
    return rewards if rewards.is_floating_point() else rewards.float()


def group_baseline(rewards: torch.Tensor, group_ids: GroupIds):
    """Per-sample float64 (r - group mean, unbiased group std, group size, group has spread), each [batch].

    r - mean and std are exactly 0 for a group whose rewards are all equal (a group of one included), so no
    rounding residue reaches the estimators. Callers cast their result back to the rewards' dtype.
    """
    wide = _as_float(rewards).double()
    means, stds, sizes = group_statistics(wide, group_ids)
    varied = filter_groups_with_variance(wide, group_ids)
    zero = torch.zeros((), dtype=wide.dtype, device=wide.device)
    return torch.where(varied, wide - means, zero), torch.where(varied, stds, zero), sizes, varied


@torch.no_grad()
def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    response_mask: torch.Tensor,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO: (r - group mean) / (group std + eps), or r - group mean when not `norm_adv_by_std` (Dr. GRPO,
    which drops the std to avoid up-weighting near-uniform groups). A group of one has no baseline to
    compare against and gets advantage 0, as does a group whose rewards are all equal (exactly 0).
    """
    rewards = _as_float(rewards)
    advantages, stds, _, _ = group_baseline(rewards, group_ids)
    if norm_adv_by_std:
        advantages = advantages / (stds + eps)
    return _broadcast(advantages.to(rewards.dtype), response_mask)


@torch.no_grad()
def rloo_advantages(rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor) -> torch.Tensor:
    """RLOO: r_i minus the mean reward of the other samples of its group (leave-one-out baseline, which keeps
    the estimate unbiased). A group of one, or of equal rewards, gets advantage 0.
    """
    rewards = _as_float(rewards)
    centred, _, sizes, _ = group_baseline(rewards, group_ids)
    # r - (sum - r) / (n - 1) = (r - mean) * n / (n - 1): exactly 0 where r - mean is
    advantages = centred * sizes / (sizes - 1).clamp(min=1)
    return _broadcast(advantages.to(rewards.dtype), response_mask)


def _generalised_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Raw GAE recursion, right to left over each row's response tokens; [batch, seq], 0 off the mask.

    Masked-out positions are not steps of the trajectory: they pass the carried V_next and A_next through
    unchanged, so padding after the response and holes inside it (e.g. tool output) neither reset nor
    discount anything. A Python loop over seq, as the recursion is sequential in t.
    """
    mask = response_mask.bool()
    advantages = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[..., 0])
    next_advantage = torch.zeros_like(token_rewards[..., 0])
    for t in reversed(range(token_rewards.shape[-1])):
        delta = token_rewards[..., t] + gamma * next_value - values[..., t]
        advantage = delta + gamma * lam * next_advantage
        advantages[..., t] = torch.where(mask[..., t], advantage, 0)
        next_value = torch.where(mask[..., t], values[..., t], next_value)
        next_advantage = torch.where(mask[..., t], advantage, next_advantage)
    return advantages


@torch.no_grad()
def discounted_returns(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_t = r_t + gamma * G_(next response token), G = 0 after the last one; [batch, seq], 0 off the mask.

    This is GAE with V = 0 and lam = 1.
    """
    token_rewards = _as_float(token_rewards)
    return _generalised_advantages(token_rewards, torch.zeros_like(token_rewards), response_mask, gamma, 1.0)


@torch.no_grad()
def reinforce_pp_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0, whiten: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: token-level discounted returns of `token_rewards` (outcome reward on the last token, minus
    any KL penalty), whitened over the whole batch under the mask. Returns (advantages, returns).
    `whiten=False` returns the returns unwhitened as advantages, for a caller that whitens over a batch
    spread across ranks (distflow.nodes.advantage).
    """
    returns = discounted_returns(token_rewards, response_mask, gamma)
    return (masked_whiten(returns, response_mask) if whiten else returns.clone()), returns


@torch.no_grad()
def reinforce_pp_baseline_advantages(
    rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor, whiten: bool = True
) -> torch.Tensor:
    """REINFORCE++ with baseline: r - group mean on every response token, then whitened over the batch.

    A group of one, or of equal rewards, has r - mean = 0 exactly before whitening (consistent with GRPO).
    `whiten=False` returns r - group mean unwhitened, for a caller that whitens over a batch spread across
    ranks (distflow.nodes.advantage).
    """
    rewards = _as_float(rewards)
    centred = _broadcast(group_baseline(rewards, group_ids)[0].to(rewards.dtype), response_mask)
    return masked_whiten(centred, response_mask) if whiten else centred


@torch.no_grad()
def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response tokens. Returns (advantages, returns).

    delta_t = r_t + gamma * V_next - V_t and A_t = delta_t + gamma * lam * A_next, where "next" is the next
    response token (V_next = A_next = 0 after the last: the episode ends). returns = A + V, before whitening,
    are the critic's targets; the advantages are then whitened over the batch under the mask.
    With gamma = lam = 1, A_t = (sum of rewards from t on) - V_t. `whiten=False` leaves the advantages raw,
    for a caller that whitens over a batch spread across ranks (distflow.nodes.advantage).
    """
    token_rewards = _as_float(token_rewards)
    values = values.to(token_rewards.dtype)
    advantages = _generalised_advantages(token_rewards, values, response_mask, gamma, lam)
    returns = torch.where(response_mask.bool(), advantages + values, 0)
    return (masked_whiten(advantages, response_mask) if whiten else advantages), returns
