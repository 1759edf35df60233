"""The README's main job, end to end: `distflow.train` under torchrun with the smoke pipeline.

Real Megatron-Core at TP=2 over gloo trains a tiny Qwen2 loaded from HF safetensors, exports it, and the
real SGLang engine generates from the export; Megatron's log-probs of the engine's samples must equal the
engine's own (same weights), and the supervised loss must fall.
"""

import json
import sys

import pytest

from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import JobFailed, run, torchrun


@pytest.mark.slow
def test_smoke_run_trains_exports_and_generates(tmp_path):
    model = make_tiny_model("qwen2", tmp_path / "tiny-qwen2", vocab=300)  # padded for TP: exercises masking
    out = tmp_path / "run"
    log = torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=600,
        args=[
            "examples/configs/smoke_cpu.yaml",
            f"model.path={model}",
            f"trainer.output_dir={out}",
            "trainer.total_steps=40",
            # A pass-through engine argument: validating it imports SGLang in every rank before the engine starts.
            "rollout.sglang.max_running_requests=64",
        ],
    )
    summary = json.loads((out / "smoke_summary.json").read_text())
    losses = summary["losses"]
    assert len(losses) == 40 and losses[-1] < 0.5 * losses[0], losses
    assert summary["engine_vs_megatron_logprob_mean_abs_diff"] <= 1e-4, summary
    assert summary["engine_vs_megatron_logprob_max_abs_diff"] <= 1e-3, summary
    assert len(summary["samples"]) == 8
    assert (out / "hf" / "model.safetensors").is_file() and "held-out prompts copied exactly" in log


def test_layout_error_stops_before_any_process_group(tmp_path):
    model = make_tiny_model("qwen2", tmp_path / "tiny-qwen2")  # 4 heads, 2 KV heads
    with pytest.raises(JobFailed, match=r"actor\.tp=4 does not divide the model's 2 KV heads"):
        run(
            [
                sys.executable,
                "-m",
                "distflow.train",
                "examples/configs/smoke_cpu.yaml",
                f"model.path={model}",
                "actor.tp=4",
            ],
            timeout_s=120,
            env={"WORLD_SIZE": "4"},
        )


def test_config_typo_names_the_valid_key():
    with pytest.raises(JobFailed, match=r"did you mean actor\.tp\?"):
        run(
            [sys.executable, "-m", "distflow.train", "examples/configs/smoke_cpu.yaml", "actor.tpp=2"],
            timeout_s=120,
        )


def test_help_documents_the_launcher():
    out = run([sys.executable, "-m", "distflow.train", "--help"], timeout_s=120)
    assert "torchrun --nproc-per-node" in out and "section.key=value" in out
