"""GRPO on a MoE actor with routing replay end to end: `distflow.train` on 2 CPU processes, a tiny Qwen3-MoE
actor at EP2 (each rank holds half the experts), one SGLang engine per rank started to return its routes;
the routes travel with the samples through the data coordinator into the old log-probs' forward and the
update, where the actor's routers replay them (jobs/routing_replay_job.py shows, router by router, that the
experts used are the engine's)."""

import pytest

from distflow.testing.copy_task import copy_task, metrics_rows, small_test_job_args
from distflow.testing.launch import torchrun


@pytest.mark.slow
def test_grpo_steps_replay_the_engines_routes(tmp_path):
    model, data = copy_task(tmp_path, train=64, family="qwen3_moe")
    out = tmp_path / "run"
    log = torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=600,
        args=[
            *small_test_job_args(model, data, out),
            "actor.tp=1",
            "actor.ep=2",
            "actor.moe_routing_replay=true",
            "trainer.total_steps=2",
        ],
    )
    assert "returning their MoE routes for the actor's routing replay" in log, log[-3000:]
    rows = metrics_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:  # the old log-probs, computed on the engine's routes and the synced weights
        assert row["rollout_corr/logprob_abs_diff"] <= 1e-3, row
        assert row["actor/grad_norm"] > 0, row
