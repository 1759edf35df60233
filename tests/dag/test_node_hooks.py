"""Controller hooks used by DAPO, in one process: a node reading renamed data (arg_names) and a node ending
the step early (SkipStep)."""

import pytest

from distflow.config import resolve
from distflow.dag import Pipeline, PipelineError
from distflow.dag.builtin import BUILTIN
from distflow.dag.controller import RankController, SkipStep


def produce(ctx, inputs):
    return {"kept": inputs["prompts"] + 1}


def consume(ctx, inputs):
    return {"out": inputs["samples"] * 10}  # a node function that only knows the name "samples"


def skip(ctx, inputs):
    ctx.append("skip ran")
    raise SkipStep("nothing to train on")


def never(ctx, inputs):
    ctx.append("never ran")
    return {"out": 0}


def test_a_node_reads_renamed_data_under_its_own_key():
    p = (
        Pipeline("t")
        .add("produce", "all", produce, ["prompts"], ["kept"])
        .add("consume", "all", consume, ["kept"], ["out"], arg_names={"kept": "samples"})
    )
    result = RankController(p, None, 0, {"all": (0,)}).run_step({"prompts": 1})
    assert result.outputs["out"] == 20 and result.skipped_at is None


def test_renaming_a_data_name_that_is_not_an_input_is_an_error():
    p = Pipeline("t").add("consume", "all", consume, ["prompts"], ["out"], arg_names={"kept": "samples"})
    with pytest.raises(
        PipelineError, match=r"node 'consume': arg_names renames 'kept', which is not one of its"
    ):
        p.validate()


def test_skip_step_ends_the_step_without_running_later_nodes():
    log = []
    p = (
        Pipeline("t")
        .add("produce", "all", produce, ["prompts"], ["kept"])
        .add("skip", "all", skip, ["kept"], ["nothing"])
        .add("never", "all", never, ["nothing"], ["out"])
    )
    result = RankController(p, log, 0, {"all": (0,)}).run_step({"prompts": 1})
    assert log == ["skip ran"] and result.skipped_at == "skip"
    assert set(result.timing_s) == {"produce", "skip"} and "out" not in result.outputs


def test_dapo_nodes_read_the_kept_batch_as_samples():
    cfg = resolve(None, ["dag.pipeline=dapo", "algorithm.dynamic_sampling=true", "actor.ppo_epochs=2"])
    pipeline = BUILTIN["dapo"](cfg)
    renamed = {n.id: dict(n.arg_names) for n in pipeline.nodes}
    assert renamed["old_logprob"] == {"kept_samples": "samples"}
    assert renamed["advantage"] == {"kept_samples": "samples", "kept_rewards": "rewards"}
    assert renamed["train_actor"] == {"kept_samples": "samples"}
    assert renamed["dynamic_sampling"] == {} and renamed["reward"] == {}
