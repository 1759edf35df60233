"""The rollout stage of each built-in pipeline: what a future step's rollout may run while this step trains."""

import pytest

from distflow.config import resolve
from distflow.dag.graph import Pipeline
from distflow.dag.loading import load_pipeline
from distflow.dag.stages import rollout_stage


@pytest.mark.parametrize(
    "overrides, stage",
    [
        (["rollout.max_staleness=1"], ("generate", "reward", "advantage")),
        (
            ["dag.pipeline=dapo", "algorithm.dynamic_sampling=true"],
            ("generate", "reward", "dynamic_sampling", "advantage"),
        ),
        # A reward model scores in the training layout: the advantage follows it there.
        (["reward.model_path=/models/rm", "rollout.max_staleness=1"], ("generate",)),
        # Token-level advantages need the actor's log-probs.
        (["algorithm.adv_estimator=reinforce_pp"], ("generate", "reward")),
        (["dag.pipeline=ppo", "critic.enable=true", "algorithm.adv_estimator=gae"], ("generate", "reward")),
    ],
)
def test_builtin_rollout_stages(overrides, stage):
    assert rollout_stage(load_pipeline(resolve(None, overrides))) == stage


def test_an_all_node_fed_by_the_training_stage_is_not_in_the_rollout():
    p = Pipeline("t", sources=("prompts",))
    p.add("gen", "rollout", "m:f", ["prompts"], ["samples"])
    p.add("lp", "actor", "m:f", ["samples"], ["lp"])
    p.add("mix", "all", "m:f", ["lp", "samples"], ["mixed"])  # runs in the actor's layout: lp comes first
    p.add("score", "reward", "m:f", ["mixed"], ["scores"])  # a rollout role, but after the training stage
    p.add("tag", "all", "m:f", ["samples"], ["tags"])
    assert rollout_stage(p) == ("gen", "tag")
