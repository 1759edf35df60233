"""The generate node's metrics on one engine owner: lengths over its samples, and the counts that weight them."""

from types import SimpleNamespace

import pytest

from distflow.nodes import rollout
from distflow.nodes.context import NodeContext, StepState, Workers
from distflow.workers.rollout.sample_packing import SampleInfo


def test_generate_records_lengths_and_counts():
    infos = {
        i: SampleInfo(
            prompt_len=p,
            response_ids=[1] * r,
            finish_reason="stop",
            data_source="d",
            ground_truth="",
            extra_info={},
            weight_version=v,
        )
        for i, (p, r, v) in enumerate([(3, 8, 2), (5, 2, 2), (4, 5, 1)])
    }
    steps = []

    def generate(prompts, eos, step, balance):
        steps.append(step)
        return SimpleNamespace(num_tokens=27, infos=infos)

    engine = SimpleNamespace(weight_version=2, balance_stats=None, generate=generate)
    ctx = NodeContext(
        SimpleNamespace(
            rollout=SimpleNamespace(max_new_tokens=8, partial=False, engine_restarts=0, env=None)
        ),
        SimpleNamespace(placement=SimpleNamespace(world_size=1, rollout_ranks=(0,))),
        0,
        SimpleNamespace(eos_token_id=0),
        Workers(rollout=engine),
        step=StepState(7),
    )
    rollout.generate(ctx, {"prompts": ["a", "b"]})
    assert "rollout/partial_fraction" not in ctx.step.metrics  # only with partial rollouts
    assert steps == [7]  # the step number reaches the sampling seeds
    m = ctx.step.metrics
    assert m["rollout/samples"] == 3 and m["rollout/tokens"] == 27 and m["rollout/weight_version"] == 1
    assert (
        m["rollout/response_length/mean"],
        m["rollout/response_length/max"],
        m["rollout/response_length/min"],
    ) == (5.0, 8.0, 2.0)
    assert m["rollout/response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert (
        m["rollout/prompt_length/mean"],
        m["rollout/prompt_length/max"],
        m["rollout/prompt_length/min"],
    ) == (4.0, 5.0, 3.0)


def test_partial_fraction_counts_the_tokens_sampled_before_an_interrupting_sync():
    def info(versions, length):
        return SampleInfo(3, [1] * length, "stop", "d", "", {}, min(versions or [2]), versions)

    # 3 of sample 0's 8 tokens came before the sync that interrupted it; sample 1 ran whole under version 2,
    # sample 2 (no per-token versions) under one version: 3 of 15 response tokens.
    infos = [info([1, 1, 1, 2, 2, 2, 2, 2], 8), info([2, 2], 2), info(None, 5)]
    assert rollout.partial_fraction(infos) == pytest.approx(3 / 15)
    assert rollout.partial_fraction([]) == 0.0


@pytest.mark.parametrize(
    "change, in_place, on_take",
    [
        ({}, True, False),
        ({"engine_restarts": 0}, False, False),
        # colocated ranks generate before they train: the actor still holds the rollout's weights
        ({"max_staleness": 1}, True, False),
        ({"stream": True}, False, False),  # the stream exists only in disaggregated runs
        # the training-only ranks are not in the rollout to hear of it: the step that takes it regenerates it
        ({"disaggregated": True}, False, True),
        ({"disaggregated": True, "max_staleness": 1}, False, True),
        ({"disaggregated": True, "engine_restarts": 0}, False, False),
        # its requests continue on the restarted engine (partial rollouts need the disaggregated placement)
        ({"disaggregated": True, "partial": True}, False, True),
        # its remaining parts leave at once; the trainer drops what it computed on them
        ({"disaggregated": True, "stream": True}, False, True),
        ({"disaggregated": True, "dynamic_sampling": True}, False, False),  # its collective is mid-rollout
    ],
)
def test_where_a_dead_engines_rollout_is_generated_again(change, in_place, on_take):
    r = SimpleNamespace(engine_restarts=2, max_staleness=0, partial=False)
    for key in ("engine_restarts", "max_staleness", "partial"):
        if key in change:
            setattr(r, key, change[key])
    cfg = SimpleNamespace(
        rollout=r, algorithm=SimpleNamespace(dynamic_sampling=change.get("dynamic_sampling", False))
    )
    placement = SimpleNamespace(
        world_size=4, rollout_ranks=(2, 3) if change.get("disaggregated") else (0, 1, 2, 3)
    )
    ctx = NodeContext(cfg, SimpleNamespace(placement=placement), 0, None)
    ctx.samples_stream = object() if change.get("stream") else None
    assert rollout.regenerates_in_place(ctx) is in_place
    assert rollout.regenerates_on_take(cfg, placement) is on_take
