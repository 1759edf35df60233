"""Exact resume of multi-turn rollouts with trajectories generated ahead: `distflow.train` disaggregated (one
Megatron training rank, one SGLang engine rank) on the lookup task, rollout.max_staleness=1, so the step-2
checkpoint is written while the engine holds the trajectories of step 3. A fresh job resumed from it
generates them again from the checkpoint's state (same prompts, same per-turn seeds, a new environment per
trajectory) and gives steps 3 and 4 the straight run's metrics."""

import shutil

import pytest

from distflow.testing.copy_task import comparable_metrics, disaggregated_test_job_args, metrics_rows
from distflow.testing.launch import torchrun
from distflow.testing.lookup_task import lookup_task

TOL = 1e-6


def _rows(out) -> dict[int, dict]:
    return {r["step"]: r for r in metrics_rows(out)}


@pytest.mark.slow
def test_multi_turn_trajectories_in_flight_resume_exactly(tmp_path):
    model, data = lookup_task(tmp_path, train=64, test=8)
    common = [
        *disaggregated_test_job_args(model, data),
        "rollout.env=lookup",
        "rollout.max_turns=2",
        "rollout.max_new_tokens=24",
        "rollout.max_total_tokens=48",
        "reward.name=auto",
        "data.max_prompt_length=32",
        "rollout.max_staleness=1",
        "trainer.total_steps=4",
        "checkpoint.save_every=2",
        "trainer.sft_warmup_steps=60",  # batches of 4 demonstrations: enough to make the policy call the tool
    ]

    def train(out, *extra):
        return torchrun(
            "distflow.train",
            nproc=2,
            module=True,
            timeout_s=600,
            args=[*common, f"trainer.output_dir={out}", *extra],
        )

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(straight)
    rows = _rows(straight)
    assert sorted(rows) == [1, 2, 3, 4]
    assert all(
        r["rollout/turns_mean"] > 1 and r["rollout/staleness_max"] == min(s - 1, 1) for s, r in rows.items()
    )
    resumed.mkdir()
    shutil.copy(straight / "metrics.jsonl", resumed / "metrics.jsonl")  # the resumed run continues it
    log = train(resumed, f"checkpoint.resume={straight / 'checkpoints' / 'step_2'}")
    assert "resumed from" in log, log[-3000:]
    again = _rows(resumed)
    for step in (3, 4):
        expected, got = comparable_metrics(rows[step]), comparable_metrics(again[step])
        assert expected.keys() == got.keys()
        for name, value in expected.items():
            assert abs(got[name] - value) <= TOL * max(1.0, abs(value)), (step, name, value, got[name])
