"""Which program a `distflow.train` job runs for dag.pipeline.

`smoke` is the end-to-end check of the pieces (distflow.smoke_run); everything else is an RL run of the
trainer over a DAG: a built-in pipeline by name or a user pipeline as 'module:function' returning a
distflow.dag.Pipeline (see distflow.dag.loading).
"""
from distflow.config import ConfigError

RUNNABLE = ("smoke", "grpo", "rloo", "ppo", "reinforce_pp", "dapo")  # built-in names a job can run (user ones too)

# The advantage estimators each built-in RL pipeline can run (the graph differs: PPO has critic nodes).
ESTIMATORS = {"grpo": ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"), "rloo": ("rloo",),
              "ppo": ("gae",), "reinforce_pp": ("reinforce_pp", "reinforce_pp_baseline")}
# Estimators that can take the KL to the reference as a reward penalty (they read per-token rewards).
KL_IN_REWARD_ESTIMATORS = ("gae", "reinforce_pp")


def resolve_pipeline(name: str):
    """Returns the `run(ctx)` function that executes dag.pipeline=`name` on every rank."""
    if name == "smoke":
        from distflow.smoke_run import run

        return run
    from distflow.trainer import run

    return run


def check_algorithm(cfg) -> None:
    """ConfigError when algorithm.* does not fit the built-in pipeline (checked before any worker starts)."""
    a, name = cfg.algorithm, cfg.dag.pipeline
    valid = ESTIMATORS.get(name)
    if valid is not None and a.adv_estimator not in valid:
        raise ConfigError(f"dag.pipeline={name} runs algorithm.adv_estimator in {list(valid)}, got "
                          f"{a.adv_estimator!r}" + ("; GAE needs the critic of dag.pipeline=ppo"
                                                    if a.adv_estimator == "gae" else ""))
    if a.kl_in_reward and a.kl_coef > 0 and a.adv_estimator not in KL_IN_REWARD_ESTIMATORS:
        raise ConfigError(f"algorithm.kl_in_reward=true needs a token-level estimator {list(KL_IN_REWARD_ESTIMATORS)}; "
                          f"with adv_estimator={a.adv_estimator!r} use the KL as a loss term (kl_in_reward=false)")
    if a.kl_coef > 0 and not cfg.ref.enable:
        raise ConfigError(f"algorithm.kl_coef={a.kl_coef} needs the reference model: set ref.enable=true, or "
                          "algorithm.kl_coef=0 to train without a KL term")
