"""--calibrate's reward measurement: a batch scored through the config's RewardPool, as a rank scores its
samples (one plain worker process; about a second)."""

from pathlib import Path

from distflow.config import resolve
from distflow.plan.simulate.calibrate import measure_reward_pool, measure_scorer

REPO = Path(__file__).resolve().parents[2]


def test_the_pool_costs_more_per_sample_than_the_scorer_alone():
    cfg = resolve(str(REPO / "examples/configs/grpo_copy_cpu.yaml"), ["model.path=x", "reward.num_workers=1"])
    measured = measure_reward_pool(cfg, samples=64, repeats=1)
    assert measured["reward_pool_workers"] == 1
    scorer_alone, _ = measure_scorer(cfg, samples=200)
    # a pipe message to the worker and one back per sample: well above the copy scorer's microseconds
    assert measured["reward_pool_s_per_sample"] > scorer_alone
