"""Multi-turn rollouts through a whole GRPO run: `distflow.train` on 2 CPU processes with
rollout.env=distflow.testing.echo_env:Echo (it answers every turn), three turns at most. The trajectories'
environment tokens travel with the samples but carry loss mask 0: the actor's recomputed log-probs equal
the engine's on every masked-in token, which they could not if an environment token (rollout log-prob 0)
were among them; the turn metrics are logged."""

import pytest

from distflow.testing.copy_task import copy_task, metrics_rows, small_test_job_args
from distflow.testing.launch import torchrun


@pytest.mark.slow
def test_grpo_steps_on_multi_turn_trajectories(tmp_path):
    model, data = copy_task(tmp_path, train=64)
    out = tmp_path / "run"
    torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=600,
        args=[
            *small_test_job_args(model, data, out),
            "rollout.env=distflow.testing.echo_env:Echo",
            "rollout.max_turns=3",
            "rollout.max_total_tokens=80",
            "trainer.total_steps=2",
        ],
    )
    rows = metrics_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert 1 < row["rollout/turns_mean"] <= 3 and row["rollout/tool_calls_mean"] >= 1, row
        assert row["rollout/env_errors"] == 0 and row["rollout/env_timeouts"] == 0, row
        assert row["rollout/response_length/max"] <= 80 < row["rollout/tokens"], row
        assert row["rollout_corr/logprob_abs_diff_max"] <= 1e-3, row
        assert row["actor/grad_norm"] > 0, row
