"""Every estimator record has its function, and compute_advantages dispatches through them by kind."""

import dataclasses

import pytest
import torch

from distflow.algorithms import compute_advantages, reinforce_pp_advantages, reinforce_pp_baseline_advantages
from distflow.algorithms.estimators import ESTIMATOR_FUNCTIONS
from distflow.config.algorithm import ESTIMATORS
from distflow.config.schema import AlgorithmConfig

REWARDS = torch.tensor([1.0, 2.0, 0.0, 0.5])
GROUPS = torch.tensor([0, 1, 0, 1])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])


def test_every_record_has_a_function_and_its_options_are_config_fields():
    assert set(ESTIMATOR_FUNCTIONS) == set(ESTIMATORS)
    fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    for e in ESTIMATORS.values():
        assert set(e.options) <= fields, e


def test_token_level_and_baseline_estimators_dispatch_with_their_options():
    token_rewards = torch.zeros(MASK.shape)
    token_rewards[torch.arange(4), MASK.sum(-1) - 1] = REWARDS
    cfg = AlgorithmConfig(adv_estimator="reinforce_pp", gamma=0.9)
    torch.testing.assert_close(
        compute_advantages(cfg, token_rewards, MASK), reinforce_pp_advantages(token_rewards, MASK, gamma=0.9)
    )
    base, returns = compute_advantages(
        dataclasses.replace(cfg, adv_estimator="reinforce_pp_baseline"), token_rewards, MASK, GROUPS
    )
    torch.testing.assert_close(base, reinforce_pp_baseline_advantages(REWARDS, GROUPS, MASK))
    assert returns is None


def test_the_unwhitened_baseline_is_r_minus_the_group_mean():
    centred = reinforce_pp_baseline_advantages(REWARDS, GROUPS, torch.ones(4, 1), whiten=False)[:, 0]
    torch.testing.assert_close(centred, torch.tensor([0.5, 0.75, -0.5, -0.75]))


def test_an_unknown_estimator_names_the_valid_ones():
    with pytest.raises(ValueError, match="valid: grpo, gae, rloo, reinforce_pp, reinforce_pp_baseline"):
        compute_advantages(AlgorithmConfig(adv_estimator="ppo"), torch.zeros(MASK.shape), MASK)
