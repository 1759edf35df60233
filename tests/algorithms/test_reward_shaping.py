"""Outcome-to-token rewards, KL penalty, DAPO overlong penalty and group filter, against hand-computed values."""

import pytest
import torch

from distflow.algorithms import (
    apply_kl_penalty,
    filter_groups_with_variance,
    group_index,
    group_statistics,
    outcome_token_rewards,
    overlong_penalty,
)


def test_outcome_reward_lands_on_the_last_response_token():
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 1, 1], [0, 0, 0]])  # right-, un-, left-padded, empty
    expected = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(outcome_token_rewards(rewards, mask), expected)


def test_kl_penalty_by_hand():
    # k1 = logprob - ref = [0.5, 0, 0.3]; coef 0.1; the third token is padding and keeps its reward.
    token_rewards = torch.tensor([[0.0, 1.0, 0.0]])
    logprob = torch.tensor([[-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, -1.3]])
    penalised = apply_kl_penalty(token_rewards, logprob, ref, 0.1, "k1", torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(penalised, torch.tensor([[-0.05, 1.0, 0.0]]))
    assert torch.equal(
        apply_kl_penalty(token_rewards, logprob, logprob, 0.1, "k3", torch.ones(1, 3)), token_rewards
    )  # zero KL at equality leaves the rewards untouched


def test_overlong_penalty_by_hand():
    # max_len 10, buffer 4: free up to 6, then -(length - 6) / 4 * factor, -factor from 10 on.
    lengths = torch.tensor([5, 6, 7, 8, 10, 12])
    torch.testing.assert_close(
        overlong_penalty(lengths, 10, 4, 1.0), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    )
    torch.testing.assert_close(
        overlong_penalty(lengths, 10, 4, 2.0), torch.tensor([0.0, 0.0, -0.5, -1.0, -2.0, -2.0])
    )
    assert torch.equal(overlong_penalty(lengths, 10, 0, 1.0), torch.zeros(6))  # buffer 0 disables it
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(lengths, 10, 11, 1.0)


def test_group_statistics_by_hand():
    # groups "a": [1, 3] (mean 2, unbiased std sqrt 2), "b": [5] (mean 5, std 0)
    means, stds, sizes = group_statistics(torch.tensor([1.0, 5.0, 3.0]), ["a", "b", "a"])
    torch.testing.assert_close(means, torch.tensor([2.0, 5.0, 2.0]))
    torch.testing.assert_close(stds, torch.tensor([2**0.5, 0.0, 2**0.5]))
    torch.testing.assert_close(sizes, torch.tensor([2.0, 1.0, 2.0]))
    index, count = group_index(torch.tensor([7, 3, 7]))
    assert count == 2 and index[0] == index[2] != index[1]


def test_filter_drops_groups_with_equal_rewards():
    # group 0 all 1 (drop), group 1 mixed (keep), group 2 a single sample (drop),
    # group 3 three equal 0.1s, whose computed mean is not exactly 0.1 (drop all the same)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0, 0.1, 0.1, 0.1], dtype=torch.float64)
    groups = torch.tensor([0, 1, 0, 1, 2, 3, 3, 3])
    keep = filter_groups_with_variance(rewards, groups)
    assert keep.tolist() == [False, True, False, True, False, False, False, False]
