"""The estimator registry (distflow.config.algorithm): the config's choices, the pipelines' estimator tables and
the critic/KL rules all come from its records; uses_reference is the one answer to "is there a reference"."""

import typing

import pytest

from distflow.config import ConfigError, resolve
from distflow.config.algorithm import (
    ESTIMATOR_NAMES,
    ESTIMATORS,
    KL_IN_REWARD_ESTIMATORS,
    estimators_of,
    uses_reference,
)
from distflow.config.schema import AlgorithmConfig
from distflow.layout import ClusterLayout


def test_the_config_choices_are_the_records():
    hint = typing.get_type_hints(AlgorithmConfig)["adv_estimator"]
    assert (
        typing.get_args(hint)
        == ESTIMATOR_NAMES
        == ("grpo", "gae", "rloo", "reinforce_pp", "reinforce_pp_baseline")
    )
    with pytest.raises(ConfigError, match="reinforce_pp"):
        resolve(None, ["algorithm.adv_estimator=reinforce_p"])


def test_pipeline_tables_and_kinds_derive_from_the_records():
    assert estimators_of("grpo") == ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
    assert estimators_of("rloo") == ("rloo",)
    assert estimators_of("ppo") == ("gae",)
    assert estimators_of("reinforce_pp") == ("reinforce_pp", "reinforce_pp_baseline")
    assert estimators_of("dapo") == ("grpo", "rloo", "reinforce_pp_baseline")
    assert estimators_of("my.module:pipeline") == ()
    assert KL_IN_REWARD_ESTIMATORS == ("gae", "reinforce_pp")
    assert [name for name, e in ESTIMATORS.items() if e.needs_critic] == ["gae"]
    # Every pipeline that runs an outcome estimator has the outcome advantage node; only ppo has a critic.
    assert all("ppo" not in e.pipelines for e in ESTIMATORS.values() if not e.needs_critic)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algorithm.adv_estimator=gae"],
            r"algorithm.adv_estimator=gae needs a critic: set critic.enable=true",
        ),
        (
            ["algorithm.kl_coef=0.1", "algorithm.kl_in_reward=true"],
            r"kl_in_reward=true needs a token-level estimator \['gae', 'reinforce_pp'\]; with adv_estimator='grpo'",
        ),
        (["algorithm.kl_coef=0.1", "ref.enable=false"], r"algorithm.kl_coef=0.1 needs the reference model"),
    ],
)
def test_estimator_rules_are_config_validation(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve(None, overrides)


def test_kl_in_reward_without_a_kl_term_is_not_an_error():
    resolve(None, ["algorithm.kl_in_reward=true"])  # kl_coef=0: no penalty to place


@pytest.mark.parametrize(
    "overrides, expected",
    [([], False), (["algorithm.kl_coef=0.01"], True), (["algorithm.kl_coef=0", "ref.enable=true"], False)],
)
def test_uses_reference_decides_the_reference_layout(overrides, expected):
    cfg = resolve(None, overrides)
    assert uses_reference(cfg) is expected
    assert (ClusterLayout.from_config(cfg, 2, None).ref is not None) is expected
