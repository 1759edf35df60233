"""rollout.max_staleness: what each combination does, and the ones refused by field before any process group;
recomputes_old_logprobs: when the old-log-prob pass is redundant."""

import pytest

from distflow.config import ConfigError, resolve
from distflow.config.algorithm import recomputes_old_logprobs
from distflow.trainer import describe_staleness

DISAGG = ["rollout.placement=disaggregated", "rollout.num_ranks=1"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.max_staleness=-1"], r"rollout\.max_staleness=-1 must be >= 0"),
        (
            ["rollout.max_staleness=1", "dag.pipeline=dapo", "algorithm.dynamic_sampling=true"],
            r"rollout\.max_staleness=1 with algorithm\.dynamic_sampling=true: .*collective over every rank",
        ),
        (
            [
                "rollout.max_staleness=2",
                "dag.pipeline=reinforce_pp",
                "algorithm.adv_estimator=reinforce_pp_baseline",
                *DISAGG,
            ],
            r"adv_estimator=reinforce_pp_baseline in the disaggregated placement: it whitens",
        ),
        (["rollout.partial=true", *DISAGG], r"rollout\.partial=true needs rollout\.max_staleness >= 1"),
        (
            ["rollout.partial=true", "rollout.max_staleness=1"],
            r"rollout\.partial=true needs rollout\.placement=disaggregated",
        ),
        (
            [
                "rollout.partial=true",
                "rollout.max_staleness=1",
                "rollout.placement=disaggregated",
                "rollout.num_ranks=2",
            ],
            r"rollout\.partial=true with rollout\.balance=steal and 2 engines: .*set rollout\.balance=partition",
        ),
        (
            [
                "rollout.partial=true",
                "rollout.max_staleness=1",
                *DISAGG,
                "rollout.sglang.disaggregation_mode=decode",
            ],
            r"rollout\.sglang\.disaggregation_mode='decode': a prefill/decode-split engine cannot interrupt",
        ),
    ],
)
def test_refused_combinations_name_the_fields(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve(None, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["rollout.max_staleness=1"],  # colocated: runs, without overlap (the start-up log says so)
        ["rollout.max_staleness=2", *DISAGG],
        ["rollout.max_staleness=1", "dag.pipeline=ppo", "critic.enable=true", "algorithm.adv_estimator=gae"],
        # Whitening in the colocated placement: every rank takes part in the rollout anyway.
        [
            "rollout.max_staleness=1",
            "dag.pipeline=reinforce_pp",
            "algorithm.adv_estimator=reinforce_pp_baseline",
        ],
        ["rollout.max_staleness=0", "dag.pipeline=dapo", "algorithm.dynamic_sampling=true"],
        ["rollout.max_staleness=1", "rollout.partial=true", *DISAGG],
        [
            "rollout.max_staleness=1",
            "rollout.partial=true",
            "rollout.placement=disaggregated",
            "rollout.num_ranks=2",
            "rollout.balance=partition",
        ],
    ],
)
def test_accepted_combinations(overrides):
    resolve(None, overrides)


def test_the_start_up_line_says_what_the_bound_does_in_each_placement():
    colocated = describe_staleness(resolve(None, ["rollout.max_staleness=1"]))
    assert "next 1 step(s) while this step trains" in colocated and "does not overlap training" in colocated
    apart = describe_staleness(resolve(None, ["rollout.max_staleness=2", *DISAGG]))
    assert "at most 2 weight version(s) older" in apart and "overlap" not in apart
    partial = describe_staleness(resolve(None, ["rollout.max_staleness=1", "rollout.partial=true", *DISAGG]))
    assert "partial rollouts: the weight sync interrupts the generation in flight" in partial


@pytest.mark.parametrize(
    "overrides, recomputes",
    [
        ([], False),  # one update of an outcome estimator: the update's forward gives them
        (["actor.mini_batch_size=64"], False),  # the whole batch (data.train_batch_size=64)
        # Stale samples: the ratio is against the sampling policy, whose log-probs the engine returned.
        (["rollout.max_staleness=1"], False),
        (["rollout.max_staleness=1", "actor.ppo_epochs=2", "actor.mini_batch_size=16"], False),
        (["actor.ppo_epochs=2"], True),
        (["actor.mini_batch_size=16"], True),
        (
            ["algorithm.adv_estimator=reinforce_pp", "dag.pipeline=reinforce_pp"],
            True,
        ),  # read before the update
        (["dag.pipeline=ppo", "critic.enable=true", "algorithm.adv_estimator=gae"], True),
        # A rollout correction clips against the proximal policy (the one before the update), stale or not:
        # the pass for several updates, one update's own forward otherwise.
        (
            [
                "rollout.max_staleness=1",
                "actor.mini_batch_size=16",
                "algorithm.rollout_correction.is_level=token",
            ],
            True,
        ),
        (["rollout.max_staleness=1", "algorithm.rollout_correction.mask_level=token"], False),
    ],
)
def test_the_old_logprob_pass_runs_only_where_it_is_needed(overrides, recomputes):
    assert recomputes_old_logprobs(resolve(None, overrides)) is recomputes
