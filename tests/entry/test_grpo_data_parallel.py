"""GRPO with the actor data-parallel (2 CPU processes: actor TP=1 x DP=2 with the distributed optimizer, one
engine of TP=2 over both ranks): the coordinator must give both DP ranks the same number of rows (Megatron's
DP ranks step together) while balancing tokens; every step's recomputed log-probs equal the engine's."""

import pytest

from distflow.testing.copy_task import copy_task, metrics_rows
from distflow.testing.launch import torchrun


@pytest.mark.slow
def test_grpo_steps_with_a_data_parallel_actor(tmp_path):
    model, data = copy_task(tmp_path, train=256)
    out = tmp_path / "run"
    torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=900,
        args=[
            "examples/configs/grpo_copy_cpu.yaml",
            f"model.path={model}",
            f"trainer.output_dir={out}",
            "actor.tp=1",
            "rollout.engine_tp=2",
            "actor.optim.use_distributed_optimizer=true",
            "trainer.total_steps=3",
            "trainer.sft_warmup_steps=0",
            "trainer.val_every=0",
            "data.train_batch_size=6",
            "rollout.n=4",
            "rollout.max_new_tokens=48",  # random-policy lengths 1..48: token balance alone would split rows unevenly
            f"data.train_files=[{data}/train.parquet]",
            "data.val_files=[]",
            "checkpoint.export_hf=false",
        ],
    )
    rows = metrics_rows(out)
    assert len(rows) == 3, rows
    assert rows[0]["rollout_corr/logprob_abs_diff"] <= 1e-3, rows[0]
    for r in rows:  # the synced weights are the actor's at every step
        assert r["rollout_corr/logprob_abs_diff"] <= 1e-3, r
        assert r["actor/grad_norm"] > 0, r
