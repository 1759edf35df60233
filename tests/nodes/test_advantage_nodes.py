"""The advantage nodes on one rank (no process group: the batch is the whole batch) against the pure
algorithms on the same padded tensors, and the padded <-> packed round trip token-level fields take."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from distflow.algorithms import advantages as adv
from distflow.algorithms.reward_shaping import apply_kl_penalty, outcome_token_rewards
from distflow.batch import from_padded, to_padded
from distflow.config.schema import AlgorithmConfig
from distflow.coordination.data import PackedBatch
from distflow.nodes import advantage
from distflow.nodes.context import NodeContext

PROMPT = 3
RESPONSES = [4, 2, 5, 3]  # response tokens per sample
GROUPS = [7, 7, 9, 9]


def _samples(seed=0) -> PackedBatch:
    generator = torch.Generator().manual_seed(seed)
    ids, masks, logprobs = [], [], []
    for n in RESPONSES:
        ids.append(torch.randint(5, 50, (PROMPT + n,), generator=generator))
        masks.append(torch.cat([torch.zeros(PROMPT), torch.ones(n)]))
        logprobs.append(torch.cat([torch.zeros(PROMPT), -torch.rand(n, generator=generator)]))
    # Ids out of order: the nodes must work in sample-id order, as to_padded gives the rows.
    return PackedBatch.from_samples(
        [12, 10, 13, 11], GROUPS, {"input_ids": ids, "response_mask": masks, "rollout_logprobs": logprobs}
    )


def _rewards(samples: PackedBatch, values) -> PackedBatch:
    return PackedBatch(
        samples.sample_ids,
        samples.groups,
        samples.lengths,
        {"rewards": torch.tensor(values, dtype=torch.float32)},
    )


def _ctx(**algorithm) -> NodeContext:
    cfg = SimpleNamespace(algorithm=dataclasses.replace(AlgorithmConfig(), **algorithm))
    return NodeContext(cfg, cluster=None, rank=0, tokenizer=None)


def test_gae_node_matches_the_algorithm():
    samples = _samples()
    batch = to_padded(samples)
    mask = batch["response_mask"]
    values = torch.randn(mask.shape) * batch["attention_mask"]
    rewards = _rewards(samples, [1.0, 0.0, 0.5, 0.25])
    ctx = _ctx(adv_estimator="gae", gamma=0.9, lam=0.8)
    out = advantage.gae(
        ctx,
        {
            "samples": samples,
            "rewards": rewards,
            "old_logprobs": batch["rollout_logprobs"],
            "values": from_padded(samples, {"values": values}),
        },
    )
    # Sample-id order: ids 10, 11, 12, 13 hold rewards 0.0, 0.25, 1.0, 0.5.
    token_rewards = outcome_token_rewards(torch.tensor([0.0, 0.25, 1.0, 0.5]), mask)
    expected, returns = adv.gae_advantages(token_rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(to_padded(out["advantages"])["advantages"], expected)
    torch.testing.assert_close(to_padded(out["returns"])["returns"], returns)
    assert ctx.step.metrics["critic/returns_mean"] == pytest.approx(float(returns[mask.bool()].mean()))


def test_reinforce_pp_node_puts_the_kl_penalty_in_the_reward():
    samples = _samples()
    batch = to_padded(samples)
    mask = batch["response_mask"]
    ref = batch["rollout_logprobs"] - 0.3 * mask
    rewards = _rewards(samples, [1.0, 0.0, 0.5, 0.25])
    ctx = _ctx(adv_estimator="reinforce_pp", gamma=0.95, kl_coef=0.1, kl_in_reward=True, kl_estimator="k1")
    out = advantage.token_level(
        ctx,
        {
            "samples": samples,
            "rewards": rewards,
            "old_logprobs": batch["rollout_logprobs"],
            "ref_logprobs": ref,
        },
    )
    token_rewards = outcome_token_rewards(torch.tensor([0.0, 0.25, 1.0, 0.5]), mask)
    # k1 = logprob - ref = 0.3 on every response token: 0.1 * 0.3 comes off each token's reward.
    penalised = apply_kl_penalty(token_rewards, batch["rollout_logprobs"], ref, 0.1, "k1", mask)
    torch.testing.assert_close(penalised, token_rewards - 0.03 * mask)
    expected, _ = adv.reinforce_pp_advantages(penalised, mask, gamma=0.95)
    torch.testing.assert_close(to_padded(out["advantages"])["advantages"], expected)
    assert ctx.step.metrics["reward/kl_penalty"] == pytest.approx(0.3)
    # critic/rewards in verl's names: each sample's outcome minus 0.03 on each of its response tokens.
    shaped = torch.tensor([0.0, 0.25, 1.0, 0.5]) - 0.03 * torch.tensor(sorted(RESPONSES))
    assert ctx.step.metrics["reward/shaped/mean"] == pytest.approx(float(shaped.mean()))
    assert ctx.step.metrics["reward/shaped/max"] == pytest.approx(float(shaped.max()))
    kept = expected[mask.bool()]
    assert ctx.step.metrics["advantage/max"] == pytest.approx(float(kept.max()))
    assert ctx.step.metrics["advantage/min"] == pytest.approx(float(kept.min()))
    assert ctx.step.metrics["advantage/mean"] == pytest.approx(float(kept.mean()), abs=1e-6)


def test_kl_in_reward_without_reference_log_probs_is_an_error():
    samples = _samples()
    batch = to_padded(samples)
    ctx = _ctx(adv_estimator="reinforce_pp", kl_coef=0.1, kl_in_reward=True)
    with pytest.raises(ValueError, match="ref.enable=true"):
        advantage.token_level(
            ctx,
            {
                "samples": samples,
                "rewards": _rewards(samples, [1.0, 0, 0, 0]),
                "old_logprobs": batch["rollout_logprobs"],
            },
        )


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_pp_baseline"])
def test_outcome_node_matches_the_algorithm(estimator):
    samples = _samples()
    rewards = _rewards(samples, [1.0, 0.0, 0.5, 0.25])
    ctx = _ctx(adv_estimator=estimator)
    out = advantage.compute(ctx, {"samples": samples, "rewards": rewards})
    per_sample = out["advantages"].fields["advantages"]
    assert ctx.step.metrics["advantage/samples"] == 4 and ctx.step.metrics[
        "reward/shaped/mean"
    ] == pytest.approx(0.4375)
    assert ctx.step.metrics["advantage/max"] == pytest.approx(float(per_sample.max()))
    assert ctx.step.metrics["advantage/min"] == pytest.approx(float(per_sample.min()))
    # The node keeps the samples' own order (ids 12, 10, 13, 11); compare on the padded responses.
    mask = torch.zeros(len(RESPONSES), max(RESPONSES))
    for i, n in enumerate(RESPONSES):
        mask[i, :n] = 1
    r, groups = rewards.fields["rewards"], torch.tensor(GROUPS)
    expected = {
        "grpo": lambda: adv.grpo_advantages(r, groups, mask),
        "rloo": lambda: adv.rloo_advantages(r, groups, mask),
        "reinforce_pp_baseline": lambda: adv.reinforce_pp_baseline_advantages(r, groups, mask),
    }[estimator]()
    torch.testing.assert_close(per_sample[:, None] * mask, expected)


def test_outcome_node_refuses_token_level_estimators():
    samples = _samples()
    with pytest.raises(ValueError, match="not an outcome estimator"):
        advantage.compute(
            _ctx(adv_estimator="gae"), {"samples": samples, "rewards": _rewards(samples, [0] * 4)}
        )
