"""Which program a `distflow.train` job runs for dag.pipeline.

`smoke` is the end-to-end check of the pieces (distflow.smoke_run); everything else is an RL run of the
trainer over a DAG: a built-in pipeline by name or a user pipeline as 'module:function' returning a
distflow.dag.Pipeline (see distflow.dag.loading).
"""
from distflow.config import ConfigError

NOT_WIRED_YET = ("ppo", "reinforce_pp")
RUNNABLE = ("smoke", "grpo", "rloo", "dapo")  # built-in names a job can run today (user pipelines too)


def resolve_pipeline(name: str):
    """Returns the `run(ctx)` function that executes dag.pipeline=`name` on every rank."""
    if name == "smoke":
        from distflow.smoke_run import run

        return run
    if name in NOT_WIRED_YET:
        raise ConfigError(f"dag.pipeline={name!r}: its graph exists (python -m distflow.dag show) but its "
                          "nodes are not wired into the trainer yet; use grpo or rloo")
    from distflow.trainer import run

    return run
