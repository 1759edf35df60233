"""REINFORCE++ (KL to the reference as a reward penalty) and REINFORCE++-baseline (KL as a loss term) end to
end: `distflow.train` on 2 CPU processes with the real Megatron-Core actor and reference at TP=2 and one real
SGLang engine per rank, for a few steps, so at step 1 actor, reference and engines hold the same weights
(with a supervised warm-up, the warmed-up actor becomes the reference). Invariants checked (as slime's CI does):
  step 1: the KL to the reference is exactly 0 and the actor's recomputed log-probs match the engine's;
  later: the KL is > 0, and it sits in the loss or in the reward as configured."""

import math
import os
from pathlib import Path

import pytest

from distflow.testing.copy_task import copy_task, metrics_rows
from distflow.testing.launch import torchrun

COMMON = [
    "ref.enable=true",
    "algorithm.kl_coef=0.05",
    "algorithm.entropy_coef=0.0",
    "trainer.sft_warmup_steps=0",
    "trainer.val_every=0",
    "data.val_files=[]",
    "data.train_batch_size=8",
    "rollout.n=4",
    "checkpoint.export_hf=false",
    "dag.pipeline=reinforce_pp",
    "reward.custom=scorers_for_entry:digits",
]
# The scorer's module, importable by every rank and the reward pool's worker processes.
ENV = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reinforce_pp")
    model, data = copy_task(root, train=256)
    return root, model, data


def _train(inputs, name: str, steps: int, overrides: list[str]) -> list[dict]:
    root, model, data = inputs
    out = root / name
    output = torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=600,
        env=ENV,
        args=[
            "examples/configs/grpo_copy_cpu.yaml",
            f"model.path={model}",
            f"trainer.output_dir={out}",
            f"data.train_files=[{data}/train.parquet]",
            f"trainer.total_steps={steps}",
            *COMMON,
            *overrides,
        ],
    )
    assert "advantage -> train_actor" in output  # the pipeline's order line names the nodes that ran
    rows = metrics_rows(out)
    assert len(rows) == steps
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
        assert "timing_s/ref_logprob" in row  # the reference ran every step
    first = rows[0]
    assert first["actor/kl"] == 0.0, first  # same weights: the KL is exactly 0, not merely small
    assert first["rollout_corr/logprob_abs_diff"] <= 1e-3, first
    assert first["reward/max"] > first["reward/min"], first  # a signal to learn from (see scorers_for_entry)
    assert rows[-1]["actor/kl"] > 0.0, rows[-1]  # the policy has moved away from the reference
    return rows


@pytest.mark.slow
def test_reinforce_pp_with_the_kl_penalty_in_the_reward(inputs):
    # Two warm-up steps first: the reference must then be the warmed-up actor for the step-1 KL to be 0.
    rows = _train(
        inputs,
        "reinforce_pp",
        3,
        [
            "algorithm.adv_estimator=reinforce_pp",
            "algorithm.kl_in_reward=true",
            "algorithm.gamma=0.99",
            "trainer.sft_warmup_steps=2",
        ],
    )
    assert rows[0]["reward/kl_penalty"] == 0.0, rows[0]
    assert rows[-1]["reward/kl_penalty"] > 0.0, rows[-1]
    for row in rows:  # the KL is in the reward, not in the loss (no entropy term either)
        assert row["actor/loss"] == pytest.approx(row["actor/pg_loss"], abs=1e-6), row


@pytest.mark.slow
def test_reinforce_pp_baseline_with_the_kl_as_a_loss_term(inputs):
    rows = _train(
        inputs,
        "reinforce_pp_baseline",
        2,
        ["algorithm.adv_estimator=reinforce_pp_baseline", "algorithm.kl_in_reward=false"],
    )
    assert "reward/kl_penalty" not in rows[-1]
    last = rows[-1]  # loss = pg_loss + kl_coef * kl (token means over the same tokens)
    assert last["actor/loss"] == pytest.approx(last["actor/pg_loss"] + 0.05 * last["actor/kl"], abs=1e-6), (
        last
    )
