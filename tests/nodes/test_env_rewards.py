"""reward.env_reward_coef: a trajectory's summed per-step environment rewards join its outcome score."""

import pytest

from distflow.nodes.reward import with_env_rewards
from distflow.workers.rollout.sample_packing import SampleInfo


def _info(env):
    return SampleInfo(3, [1, 2], "stop", "src", "7", {}, env=env)


def test_the_summed_step_rewards_are_added_with_their_coefficient():
    infos = [_info({"env_reward": 1.5}), _info({"turns": 1}), _info(None)]  # no step rewards: nothing added
    rewards, mean_added = with_env_rewards([1.0, 0.25, 0.0], infos, 0.2)
    assert rewards == pytest.approx([1.3, 0.25, 0.0])
    assert mean_added == pytest.approx(0.1)


def test_a_reward_per_sample_is_required():
    with pytest.raises(ValueError):
        with_env_rewards([1.0], [_info(None), _info(None)], 1.0)
