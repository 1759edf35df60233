"""Metric reductions over ranks: max/min as max/min, counts summed, per-rank means weighted by sample counts."""

import json
from pathlib import Path

import pytest

from distflow.testing.launch import torchrun
from distflow.tracking.reduce import MAX, MEAN, MIN, SUM, reduce_metrics, reduction_for

JOB = Path(__file__).parent / "jobs" / "reduce_job.py"


def test_reduction_table():
    assert reduction_for("reward/max") == MAX and reduction_for("rollout/response_length/min") == MIN
    assert reduction_for("rollout/prompt_length/max") == MAX and reduction_for("advantage/min") == MIN
    assert reduction_for("rollout/tokens") == SUM and reduction_for("reward/timeouts") == SUM
    assert reduction_for("rollout/weight_version") == MIN and reduction_for("sync/seconds") == MAX
    assert reduction_for("timing_s/generate") == MAX and reduction_for("rollout/stale_dropped") == SUM
    assert reduction_for("rollout/staleness_max") == MAX
    assert reduction_for("reward/mean").weight == "reward/samples"
    assert reduction_for("rollout/response_length/clip_ratio").weight == "rollout/samples"
    assert reduction_for("perf/max_memory_allocated_gb") == MAX
    # Counters every rank holds the same copy of are not summed: that would multiply them by the ranks.
    assert reduction_for("rollout/stolen_groups") == MEAN and reduction_for("actor/pg_loss") == MEAN
    assert reduction_for("rollout/engine_tokens_max_over_mean") == MEAN


def test_reduce_metrics_unequal_ranks():
    per_rank = [
        {
            "reward/mean": 0.2,
            "reward/samples": 3,
            "reward/max": 0.5,
            "reward/min": 0.0,
            "rollout/tokens": 120,
            "reward/errors": 1,
            "actor/pg_loss": 0.5,
        },
        {
            "reward/mean": 1.0,
            "reward/samples": 1,
            "reward/max": 1.0,
            "reward/min": 1.0,
            "rollout/tokens": 40,
            "reward/errors": 2,
            "actor/pg_loss": 0.5,
        },
        {"actor/pg_loss": 0.5},
    ]  # a training-only rank: no rollout metrics
    out = reduce_metrics(per_rank)
    assert out["reward/mean"] == pytest.approx((0.2 * 3 + 1.0) / 4)  # not (0.2 + 1.0) / 2
    assert out["reward/max"] == 1.0 and out["reward/min"] == 0.0
    assert out["rollout/tokens"] == 160 and out["reward/errors"] == 3 and out["reward/samples"] == 4
    assert out["actor/pg_loss"] == 0.5


def test_weighted_mean_edge_cases():
    # No rank recorded the weight (a metric already global): each rank weighs 1.
    assert reduce_metrics([{"reward/mean": 0.2}, {"reward/mean": 0.4}])["reward/mean"] == pytest.approx(0.3)
    # Every rank had no samples: no division by zero.
    zero = [{"reward/mean": 0.0, "reward/samples": 0}, {"reward/mean": 0.0, "reward/samples": 0}]
    assert reduce_metrics(zero)["reward/mean"] == 0.0
    assert reduce_metrics([]) == {}


def test_two_gloo_ranks(tmp_path):
    out = tmp_path / "reduced.json"
    torchrun(JOB, nproc=2, args=["--out", out], timeout_s=120)
    got = json.loads(out.read_text())
    assert got["reward/mean"] == pytest.approx((0.2 * 3 + 1.0 * 1) / 4)
    assert got["reward/max"] == 1.0 and got["reward/min"] == 0.0
    assert got["rollout/response_length/mean"] == pytest.approx((10 * 3 + 30 * 1) / 4)
    assert got["rollout/response_length/max"] == 30 and got["rollout/response_length/min"] == 6
    assert got["rollout/tokens"] == 160 and got["reward/errors"] == 1 and got["rollout/samples"] == 4
    assert got["rollout/weight_version"] == 3
    assert got["actor/pg_loss"] == 0.25
    assert got["dapo/attempts"] == 2  # recorded by one rank only: its value, not halved
