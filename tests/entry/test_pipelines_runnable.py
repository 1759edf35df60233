"""Every built-in pipeline is runnable by distflow.train, `python -m distflow.dag show` prints
each, and algorithm settings that do not fit a pipeline fail before any worker starts, naming the field."""

import pytest

from distflow.config import ConfigError, resolve
from distflow.dag.__main__ import main as dag_main
from distflow.dag.builtin import BUILTIN
from distflow.dag.loading import RUNNABLE, load_pipeline
from distflow.train import program

# The settings each built-in pipeline needs on top of the defaults (the nodes that show it is that pipeline).
SETTINGS = {
    "grpo": ([], "advantage         role=all"),
    "rloo": (["algorithm.adv_estimator=rloo"], "outcome advantages per sample (rloo)"),
    "ppo": (["critic.enable=true", "algorithm.adv_estimator=gae"], "train_critic      role=critic"),
    "reinforce_pp": (
        ["algorithm.adv_estimator=reinforce_pp", "algorithm.kl_coef=0.01", "algorithm.kl_in_reward=true"],
        "KL penalty in the reward",
    ),
    "dapo": (["algorithm.dynamic_sampling=true"], "dynamic_sampling"),
}


def test_every_builtin_is_runnable():
    assert set(BUILTIN) <= set(RUNNABLE)
    from distflow.trainer import run

    for name in BUILTIN:
        assert program(name) is run
        cfg = resolve(None, [f"dag.pipeline={name}", *SETTINGS[name][0]])
        load_pipeline(cfg)  # the pipeline's own check passes


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_dag_show_prints_every_builtin(name, capsys):
    overrides, expected = SETTINGS[name]
    assert (
        dag_main(
            [
                "show",
                f"dag.pipeline={name}",
                *overrides,
                "actor.tp=2",
                "--world-size",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"pipeline {name}:" in out and "sync_weights" in out
    assert expected in out, out


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["dag.pipeline=rloo"], r"dag.pipeline=rloo runs algorithm.adv_estimator in \['rloo'\], got 'grpo'"),
        (["algorithm.adv_estimator=gae", "critic.enable=true"], "GAE needs the critic of dag.pipeline=ppo"),
        (
            ["dag.pipeline=ppo", "critic.enable=true"],
            r"dag.pipeline=ppo runs algorithm.adv_estimator in \['gae'\]",
        ),
        (
            ["algorithm.kl_coef=0.1", "algorithm.kl_in_reward=true"],
            "kl_in_reward=true needs a token-level estimator",
        ),
        (["algorithm.kl_coef=0.1", "ref.enable=false"], "needs the reference model: set ref.enable=true"),
    ],
)
def test_algorithm_that_does_not_fit_the_pipeline_is_a_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_pipeline(resolve(None, overrides))
