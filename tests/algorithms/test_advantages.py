"""Advantage estimators against hand-computed values and their defining properties."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distflow.algorithms import (
    compute_advantages,
    gae_advantages,
    grpo_advantages,
    masked_whiten,
    outcome_token_rewards,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from distflow.config.schema import AlgorithmConfig

# Three interleaved groups: 0 -> rewards [1, 0, 0.5], 1 -> [2, 4], 2 -> [7] (a group of one).
REWARDS = torch.tensor([1.0, 2.0, 0.0, 0.5, 4.0, 7.0])
GROUPS = torch.tensor([0, 1, 0, 0, 1, 2])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])


def per_sequence(advantages, mask=MASK):
    """The one value each row carries on its response tokens, after checking it is constant and 0 off the mask."""
    assert torch.equal(advantages[~mask.bool()], torch.zeros_like(advantages[~mask.bool()]))
    first = advantages[:, 0]
    torch.testing.assert_close(torch.where(mask.bool(), first[:, None], 0.0), advantages)
    return first


def test_grpo_by_hand():
    # group 0: mean 0.5, unbiased std sqrt((0.25 + 0.25 + 0) / 2) = 0.5 -> [1, -1, 0]
    # group 1: mean 3,   unbiased std sqrt((1 + 1) / 1) = sqrt(2)     -> [-1/sqrt 2, 1/sqrt 2]
    # group 2: one sample -> 0
    expected = torch.tensor([0.5 / 0.500001, -1 / 2**0.5, -0.5 / 0.500001, 0.0, 1 / 2**0.5, 0.0])
    torch.testing.assert_close(
        per_sequence(grpo_advantages(REWARDS, GROUPS, MASK)), expected, atol=1e-5, rtol=0
    )


def test_dr_grpo_only_centres():
    expected = torch.tensor([0.5, -1.0, -0.5, 0.0, 1.0, 0.0])  # r - group mean; group of one -> 0
    torch.testing.assert_close(
        per_sequence(grpo_advantages(REWARDS, GROUPS, MASK, norm_adv_by_std=False)), expected
    )


def test_group_labels_may_be_any_hashables():
    labels = ["uid-a", "uid-b", "uid-a", "uid-a", "uid-b", "uid-c"]
    torch.testing.assert_close(grpo_advantages(REWARDS, labels, MASK), grpo_advantages(REWARDS, GROUPS, MASK))


@settings(max_examples=50, deadline=None)
@given(
    samples=st.lists(st.tuples(st.floats(-10, 10), st.integers(0, 3)), min_size=1, max_size=12),
    by_std=st.booleans(),
)
def test_grpo_and_rloo_advantages_of_a_group_sum_to_zero(samples, by_std):
    rewards = torch.tensor([r for r, _ in samples], dtype=torch.float64)
    groups = torch.tensor([g for _, g in samples])
    mask = torch.ones(len(samples), 2)
    for advantages in (
        grpo_advantages(rewards, groups, mask, by_std),
        rloo_advantages(rewards, groups, mask),
    ):
        sums = torch.zeros(4, dtype=torch.float64).index_add(0, groups, advantages[:, 0])
        torch.testing.assert_close(sums, torch.zeros(4, dtype=torch.float64), atol=1e-6, rtol=0)


@pytest.mark.parametrize("value", [0.7, 0.1, 0.3, 1 / 3, 0.9, 1e-3, 123.456])
def test_a_group_of_equal_rewards_gets_exactly_zero(value):
    # float32 [0.7] * 8 has a mean one ulp off 0.7; divided by a one-ulp std (+ eps 1e-6) that was ~0.056 of
    # one sign for the whole group. Equal rewards carry no signal: every group estimator gives exactly 0, here
    # beside a varied group whose advantages must stay as before: [0, 1] * 4 -> +-1 / (std + eps), RLOO +-8/7.
    rewards = torch.tensor([value] * 8 + [0.0, 1.0] * 4)
    groups = torch.tensor([0] * 8 + [1] * 8)
    mask = torch.ones(16, 2)
    std = (8 * 0.25 / 7) ** 0.5
    signs = torch.tensor([-1.0, 1.0] * 4)
    grpo = per_sequence(grpo_advantages(rewards, groups, mask), mask)
    assert grpo[:8].tolist() == [0.0] * 8
    torch.testing.assert_close(grpo[8:], signs * 0.5 / (std + 1e-6))
    dr_grpo = per_sequence(grpo_advantages(rewards, groups, mask, norm_adv_by_std=False), mask)
    assert dr_grpo[:8].tolist() == [0.0] * 8
    rloo = per_sequence(rloo_advantages(rewards, groups, mask), mask)
    assert rloo[:8].tolist() == [0.0] * 8
    torch.testing.assert_close(rloo[8:], signs * 4 / 7)  # 1 - 3/7 = 4/7, 0 - 4/7
    baseline = per_sequence(reinforce_pp_baseline_advantages(rewards, groups, mask), mask)
    assert baseline[:8].tolist() == [0.0] * 8
    # centred [0]*8 + [-0.5, 0.5]*4 over 32 tokens: mean 0, unbiased var (16 * 0.25) / 31
    torch.testing.assert_close(baseline[8:], signs * 0.5 / (4 / 31 + 1e-8) ** 0.5)
    assert grpo.dtype == rloo.dtype == baseline.dtype == torch.float32


def test_rloo_by_hand():
    # group 0: 1 - (0 + 0.5) / 2 = 0.75, 0 - (1 + 0.5) / 2 = -0.75, 0.5 - (1 + 0) / 2 = 0
    # group 1: 2 - 4 = -2, 4 - 2 = 2; group 2: one sample -> 0
    expected = torch.tensor([0.75, -2.0, -0.75, 0.0, 2.0, 0.0])
    torch.testing.assert_close(per_sequence(rloo_advantages(REWARDS, GROUPS, MASK)), expected)


def test_reinforce_pp_by_hand():
    # gamma 0.5. row 0: rewards [0, 0, 1] -> returns [0.25, 0.5, 1]; row 1: [0, 2, pad] -> [1, 2, 0]
    # masked returns [0.25, 0.5, 1, 1, 2]: mean 0.95, deviations [-0.7, -0.45, 0.05, 0.05, 1.05],
    # unbiased var (0.49 + 0.2025 + 0.0025 + 0.0025 + 1.1025) / 4 = 0.45
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages, returns = reinforce_pp_advantages(token_rewards, mask, gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    deviations = torch.tensor([[-0.7, -0.45, 0.05], [0.05, 1.05, 0.0]])
    torch.testing.assert_close(advantages, deviations / 0.45**0.5)
    unwhitened, _ = reinforce_pp_advantages(token_rewards, mask, gamma=0.5, whiten=False)
    torch.testing.assert_close(unwhitened, returns)


def test_masked_holes_are_not_steps():
    # A tool-output hole at t = 1: its reward is ignored and it does not discount: [1 * 0.5, 0, 1]
    _, returns = reinforce_pp_advantages(
        torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[1, 0, 1]]), gamma=0.5
    )
    torch.testing.assert_close(returns, torch.tensor([[0.5, 0.0, 1.0]]))


def test_reinforce_pp_baseline_by_hand():
    # group means 0.5 and 2 -> centred [0.5, -0.5, 1, -1] on one token each; batch mean 0,
    # unbiased var (0.25 + 0.25 + 1 + 1) / 3 = 2.5 / 3
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    mask = torch.tensor([[1, 0], [1, 0], [1, 0], [1, 0]])
    advantages = reinforce_pp_baseline_advantages(rewards, torch.tensor([0, 0, 1, 1]), mask)
    expected = torch.tensor([0.5, -0.5, 1.0, -1.0]) / (2.5 / 3) ** 0.5
    torch.testing.assert_close(per_sequence(advantages, mask), expected)


def test_gae_by_hand():
    # gamma 0.9, lam 0.8 (gamma * lam = 0.72). Row 0, three tokens, rewards [0, 0, 1], values [0.5, 0.6, 0.7]:
    #   t2: delta = 1 - 0.7 = 0.3;               A2 = 0.3
    #   t1: delta = 0.9 * 0.7 - 0.6 = 0.03;      A1 = 0.03 + 0.72 * 0.3   = 0.246
    #   t0: delta = 0.9 * 0.6 - 0.5 = 0.04;      A0 = 0.04 + 0.72 * 0.246 = 0.21712
    # Row 1, two tokens and padding (junk reward and value there), rewards [0, 1], values [0.2, 0.4]:
    #   t1: delta = 1 - 0.4 = 0.6;               A1 = 0.6
    #   t0: delta = 0.9 * 0.4 - 0.2 = 0.16;      A0 = 0.16 + 0.72 * 0.6 = 0.592
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 9.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages, returns = gae_advantages(token_rewards, values, mask, gamma=0.9, lam=0.8)
    raw = torch.tensor([[0.21712, 0.246, 0.3], [0.592, 0.6, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(returns, torch.where(mask.bool(), raw + values, 0.0))
    torch.testing.assert_close(advantages, masked_whiten(raw, mask))
    unwhitened, same_returns = gae_advantages(token_rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(unwhitened, raw)
    torch.testing.assert_close(same_returns, returns)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 5), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_gae_with_unit_gamma_and_lambda_is_returns_minus_values(lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    token_rewards = torch.randn(len(lengths), 5, generator=generator, dtype=torch.float64)
    values = torch.randn(len(lengths), 5, generator=generator, dtype=torch.float64)
    mask = torch.arange(5)[None] < torch.tensor(lengths)[:, None]
    advantages, returns = gae_advantages(token_rewards, values, mask, gamma=1.0, lam=1.0)
    masked_rewards = torch.where(mask, token_rewards, 0.0)
    rewards_to_go = masked_rewards.flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(returns, torch.where(mask, rewards_to_go, 0.0))
    torch.testing.assert_close(advantages, masked_whiten(rewards_to_go - values, mask))


def test_compute_advantages_dispatches_on_the_config():
    token_rewards = outcome_token_rewards(REWARDS, MASK)
    cfg = AlgorithmConfig()
    advantages, returns = compute_advantages(cfg, token_rewards, MASK, GROUPS)
    torch.testing.assert_close(advantages, grpo_advantages(REWARDS, GROUPS, MASK))
    assert returns is None
    rloo, _ = compute_advantages(dataclasses.replace(cfg, adv_estimator="rloo"), token_rewards, MASK, GROUPS)
    torch.testing.assert_close(rloo, rloo_advantages(REWARDS, GROUPS, MASK))
    values = torch.zeros(MASK.shape)
    gae, gae_returns = compute_advantages(
        dataclasses.replace(cfg, adv_estimator="gae", lam=0.95), token_rewards, MASK, values=values
    )
    torch.testing.assert_close((gae, gae_returns), gae_advantages(token_rewards, values, MASK, 1.0, 0.95))
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages(cfg, token_rewards, MASK)
    with pytest.raises(ValueError, match="values"):
        compute_advantages(dataclasses.replace(cfg, adv_estimator="gae"), token_rewards, MASK)
