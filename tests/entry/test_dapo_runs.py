"""DAPO end to end: `distflow.train` with dag.pipeline=dapo on 2 CPU processes (real Megatron-Core actor at
TP=2, one real SGLang engine per rank), the dynamic-sampling node refilling the batch with further rounds of
real generation, and a run whose every group is uninformative skipping its updates cleanly."""

import sys

import pytest

from distflow.models.tiny import make_tiny_model
from distflow.testing.copy_task import metrics_rows
from distflow.testing.launch import torchrun

BATCH, N, ATTEMPTS = 8, 4, 3


@pytest.fixture(scope="module")
def copy_task(tmp_path_factory):
    from distflow.testing.launch import run

    root = tmp_path_factory.mktemp("dapo")
    model = make_tiny_model("qwen2", root / "tiny-qwen2", vocab=300)
    run(
        [
            sys.executable,
            "tools/prepare_data.py",
            "copy",
            "--out",
            root / "copy",
            "--digits",
            "4",
            "--train",
            "2000",
            "--test",
            "16",
            "--seed",
            "1",
        ],
        timeout_s=300,
    )
    return model, root / "copy"


def _train(copy_task, out, *overrides):
    model, data = copy_task
    torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=900,
        args=[
            "examples/configs/dapo_copy_cpu.yaml",
            f"model.path={model}",
            f"trainer.output_dir={out}",
            f"data.train_files=[{data}/train.parquet]",
            "data.val_files=[]",
            f"data.train_batch_size={BATCH}",
            f"rollout.n={N}",
            f"algorithm.max_sampling_attempts={ATTEMPTS}",
            *overrides,
        ],
    )
    return metrics_rows(out)


@pytest.mark.slow
def test_dapo_refills_the_batch_and_trains(copy_task, tmp_path):
    rows = _train(copy_task, tmp_path / "run", "trainer.total_steps=3")
    assert len(rows) == 3
    for r in rows:
        attempts, kept = r["dapo/attempts"], r["dapo/kept_groups"]
        assert 1 <= attempts <= ATTEMPTS and 0 < kept <= BATCH, r
        # Every round draws a full batch of prompts on every engine; each generated group is kept, trimmed
        # or dropped, exactly once.
        assert r["dapo/generated_groups"] == attempts * BATCH, r
        assert kept + r["dapo/trimmed_groups"] + r["dapo/dropped_groups"] == r["dapo/generated_groups"], r
        assert r["dapo/partial_batch"] == (kept < BATCH) and (kept == BATCH or attempts == ATTEMPTS), r
        assert r["dapo/skipped_update"] == 0 and r["actor/optimizer_steps"] >= 1, r
        assert r["dapo/overlong_penalty"] <= 0, r
    # The tiny model's copy rewards are mostly all-zero per group: the first round is short of 8 groups
    # and the node generates again (measured with this config on 9000 prompts: 3 rounds in each step,
    # 13/11/14 groups dropped and 3/5/2 trimmed; recomputed log-prob diff 3e-7).
    assert max(r["dapo/attempts"] for r in rows) >= 2, [r["dapo/attempts"] for r in rows]
    # Step 1: the actor recomputes the engine's log-probs (of samples from every round) on the same weights.
    assert rows[0]["rollout_corr/logprob_abs_diff"] <= 1e-3, rows[0]
    assert (tmp_path / "run" / "hf" / "model.safetensors").is_file()


@pytest.mark.slow
def test_steps_without_an_informative_group_skip_the_update(copy_task, tmp_path):
    # Greedy sampling makes the n answers of a prompt identical, so every group's rewards are equal.
    rows = _train(
        copy_task,
        tmp_path / "run",
        "trainer.total_steps=2",
        "trainer.sft_warmup_steps=0",
        "rollout.temperature=0",
    )
    assert len(rows) == 2
    for r in rows:
        assert r["dapo/skipped_update"] == 1 and r["dapo/kept_groups"] == 0, r
        assert r["dapo/attempts"] == ATTEMPTS and r["dapo/dropped_groups"] == ATTEMPTS * BATCH, r
        assert not any(k.startswith("actor/") for k in r), r  # the actor nodes did not run
        assert "timing_s/train_actor" not in r and "timing_s/dynamic_sampling" in r
