"""Advantage nodes: outcome advantages where the samples were scored, token-level ones where training runs.

compute        the outcome estimators of distflow.config.algorithm.ESTIMATORS (grpo, rloo,
               reinforce_pp_baseline): one advantage per sample from its outcome reward, on the rollout layout
               with each prompt's group whole on one rank (role "all", keep_groups).
token_level    reinforce_pp (no critic): advantages only.
gae            gae (PPO): advantages and the critic's returns.
The token-level nodes run on the actor's layout, where the old log-probs, the reference's log-probs (for
the KL penalty in the reward) and the critic's values already are; only the rewards move there.
Whitening is over the whole step's batch, across ranks: one all-reduce of (sum, sum of squares, count).
"""

import torch
import torch.distributed as dist

from distflow.algorithms import advantages as adv
from distflow.algorithms.aggregation import masked_sum
from distflow.algorithms.estimators import ESTIMATOR_FUNCTIONS, estimator_options
from distflow.algorithms.reward_shaping import apply_kl_penalty, outcome_token_rewards
from distflow.batch import from_padded, to_padded
from distflow.config.algorithm import ESTIMATORS
from distflow.coordination.data import PackedBatch

OUTCOME_ESTIMATORS = tuple(name for name, e in ESTIMATORS.items() if e.kind == "outcome")


def compute(ctx, inputs):
    """Per-sample advantages (a fixed `advantages` field) for the outcome estimators. Collective for the
    estimators that whiten over the batch (reinforce_pp_baseline), so every rank calls it, holding samples or
    not."""
    samples, rewards = inputs["samples"], inputs["rewards"]
    a = ctx.cfg.algorithm
    if a.adv_estimator not in OUTCOME_ESTIMATORS:
        raise ValueError(
            f"algorithm.adv_estimator={a.adv_estimator!r} is not an outcome estimator "
            f"{OUTCOME_ESTIMATORS}; the pipeline should use a token-level advantage node"
        )
    estimator = ESTIMATORS[a.adv_estimator]
    if samples is None:
        if estimator.whitens:
            _token_weighted_whiten(torch.zeros(0), torch.zeros(0), group=None)
        return {"advantages": None}
    assert torch.equal(samples.sample_ids, rewards.sample_ids), "rewards must come in the samples' order"
    r = rewards.fields["rewards"]
    ones = torch.ones(len(r), 1)  # one "token" per sample: outcome advantages are per sample
    fn, options = ESTIMATOR_FUNCTIONS[estimator.name], estimator_options(estimator, a)
    if (
        estimator.whitens
    ):  # r - group mean (exactly 0 for all-equal groups), whitened over every rank's tokens
        centred = fn(r, samples.groups, ones, whiten=False, **options)[:, 0].float()
        values = _token_weighted_whiten(centred, _response_lengths(samples), group=None)
    else:
        values = fn(r, samples.groups, ones, **options)[:, 0]
    _record_stats(ctx, "advantage", values.float())
    _record_stats(ctx, "reward/shaped", r.float())  # what is trained on (DAPO: after overlong shaping)
    ctx.record(**{"advantage/samples": len(r)})  # the weight of the two means over ranks
    return {
        "advantages": PackedBatch(
            samples.sample_ids, samples.groups, samples.lengths, {"advantages": values.float()}
        )
    }


def token_level(ctx, inputs):
    """REINFORCE++: whitened discounted returns of the token rewards (outcome on the last token, minus
    algorithm.kl_coef x KL to the reference per token when algorithm.kl_in_reward)."""
    advantages, _returns, _mask = _token_level(ctx, inputs, values=None)
    return {"advantages": from_padded(inputs["samples"], {"advantages": advantages})}


def gae(ctx, inputs):
    """PPO: GAE advantages (algorithm.gamma, algorithm.lam) from the critic's values, whitened over the
    batch; returns = raw advantages + values are the critic's targets."""
    values = to_padded(inputs["values"])["values"]
    advantages, returns, mask = _token_level(ctx, inputs, values=values)
    ctx.record(**{"critic/returns_mean": _global_masked_mean(returns, mask).item()})
    samples = inputs["samples"]
    return {
        "advantages": from_padded(samples, {"advantages": advantages}),
        "returns": from_padded(samples, {"returns": returns}),
    }


def _token_level(ctx, inputs, values):
    a = ctx.cfg.algorithm
    samples = inputs["samples"]
    batch = to_padded(samples)
    mask = batch["response_mask"]
    rewards = inputs["rewards"].sorted_by_id()
    assert torch.equal(rewards.sample_ids, samples.sorted_by_id().sample_ids), (
        "the rewards must cover the same samples as the batch on this rank"
    )
    token_rewards = outcome_token_rewards(rewards.fields["rewards"].float(), mask)
    if a.kl_in_reward and a.kl_coef > 0:
        ref = inputs.get("ref_logprobs")
        if ref is None:
            raise ValueError("algorithm.kl_in_reward needs the reference's log-probs: set ref.enable=true")
        outcome = token_rewards
        token_rewards = apply_kl_penalty(
            outcome, inputs["old_logprobs"], ref, a.kl_coef, a.kl_estimator, mask
        )
        # The mean per-token KL the penalty subtracted (before kl_coef): 0 while the policy is the reference.
        ctx.record(
            **{"reward/kl_penalty": _global_masked_mean((outcome - token_rewards) / a.kl_coef, mask).item()}
        )
    if values is None:
        raw, returns = adv.reinforce_pp_advantages(token_rewards, mask, a.gamma, whiten=False)
    else:
        raw, returns = adv.gae_advantages(token_rewards, values, mask, a.gamma, a.lam, whiten=False)
    advantages = _whiten_over_ranks(raw, mask)
    # advantage/mean over the whole batch; max and min of this rank's tokens, reduced over ranks by max/min.
    kept = advantages[mask.bool()]
    ctx.record(**{"advantage/mean": _global_masked_mean(advantages, mask).item()})
    if kept.numel():
        ctx.record(**{"advantage/max": kept.max().item(), "advantage/min": kept.min().item()})
    # Each sample's reward summed over its tokens: the outcome, minus the KL penalty when it is in the reward.
    _record_stats(ctx, "reward/shaped", (token_rewards * mask).sum(-1))
    return advantages, returns, mask


def _record_stats(ctx, prefix: str, values: torch.Tensor) -> None:
    """<prefix>/mean|max|min of this rank's values (nothing when it holds none)."""
    if values.numel():
        ctx.record(
            **{
                f"{prefix}/mean": values.mean().item(),
                f"{prefix}/max": values.max().item(),
                f"{prefix}/min": values.min().item(),
            }
        )


def _data_parallel_group():
    """The group whose ranks hold different rows of the training batch (TP/PP ranks hold copies)."""
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


def _whiten_over_ranks(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """masked_whiten over the batch of every data-parallel rank (unbiased variance, as masked_whiten)."""
    m = mask.bool()
    kept = torch.where(m, values, 0).to(torch.float64)
    stats = torch.stack([kept.sum(), kept.square().sum(), m.sum().to(torch.float64)])
    if dist.is_initialized():
        dist.all_reduce(stats, group=_data_parallel_group())
    mean, var = _mean_and_unbiased_var(stats)
    whitened = (values - mean) * torch.rsqrt(torch.as_tensor(var + eps, dtype=values.dtype))
    return torch.where(m, whitened, 0)


def _token_weighted_whiten(per_sample: torch.Tensor, lengths: torch.Tensor, group) -> torch.Tensor:
    """Whitens per-sample values as if each were repeated on its `lengths` response tokens, over all ranks
    (the rollout layout: each sample is held by exactly one rank, ranks without samples add zeros)."""
    x, w = per_sample.to(torch.float64), lengths.to(torch.float64)
    stats = torch.stack([(x * w).sum(), (x * x * w).sum(), w.sum()])
    if dist.is_initialized():
        dist.all_reduce(stats, group=group)
    mean, var = _mean_and_unbiased_var(stats)
    return ((x - mean) / (var + 1e-8) ** 0.5).to(per_sample.dtype)


def _mean_and_unbiased_var(stats: torch.Tensor) -> tuple[float, float]:
    total, total_sq, count = stats.tolist()
    if count == 0:
        return 0.0, 0.0
    mean = total / count
    var = max(total_sq - count * mean * mean, 0.0) / max(count - 1, 1)
    return mean, var


def _response_lengths(samples: PackedBatch) -> torch.Tensor:
    counts = samples.rows("response_mask")
    owner = torch.repeat_interleave(torch.arange(len(samples)), counts)
    return torch.zeros(len(samples)).index_add_(0, owner, samples.fields["response_mask"].float())


def _global_masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    stats = torch.stack([masked_sum(values.double(), mask), mask.bool().sum().double()])
    if dist.is_initialized():
        dist.all_reduce(stats, group=_data_parallel_group())
    return stats[0] / stats[1].clamp(min=1)
