"""Two GRPO steps on the gsm_symbolic parquet with the gsm8k reward, end to end on 2 CPU processes.

A tiny random model cannot solve the problems; the run checks the plumbing of a real maths run: chat
prompts of hundreds of tokens through the prompt-length filter, the engines and the coordinator, the
GSM8K scorer in its process pool (no scorer errors), validation on the test split, and the
step-1 invariant that the actor recomputes the engine's log-probs.
"""

import sys

import pytest

from distflow.models.tiny import make_tiny_model
from distflow.testing.copy_task import metrics_rows
from distflow.testing.launch import run, torchrun


@pytest.mark.slow
def test_two_grpo_steps_on_gsm_symbolic(tmp_path):
    model = make_tiny_model("qwen2", tmp_path / "tiny-qwen2")
    data = tmp_path / "gsm"
    run(
        [
            sys.executable,
            "tools/prepare_data.py",
            "gsm_symbolic",
            "--out",
            data,
            "--train",
            "16",
            "--test",
            "4",
            "--seed",
            "1",
        ],
        timeout_s=300,
    )
    out = tmp_path / "run"
    torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=900,
        args=[
            "examples/configs/grpo_gsm_symbolic_cpu.yaml",
            f"model.path={model}",
            f"trainer.output_dir={out}",
            f"data.train_files=[{data}/train.parquet]",
            f"data.val_files=[{data}/test.parquet]",
        ],
    )
    rows = metrics_rows(out)
    assert [r["step"] for r in rows] == [1, 2], rows
    for r in rows:
        assert r["reward/errors"] == 0 and r["reward/timeouts"] == 0, r
        assert 0.0 <= r["reward/mean"] <= 1.0 and r["rollout/tokens"] > 0, r
        assert "actor/pg_loss" in r and "timing_s/train_actor" in r, sorted(r)
    assert rows[0]["rollout_corr/logprob_abs_diff"] <= 1e-3, rows[0]
    assert "val/reward/mean" in rows[-1], rows[-1]
    assert (out / "hf" / "model.safetensors").is_file()
