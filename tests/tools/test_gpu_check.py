"""tools/gpu_check.sh / gpu_check.py in its CPU smoke run: the same code paths as on the GPU, on a tiny model.

The run goes through gpu_check.sh (with an empty wheels folder) and the SGLang stand-in (as on the GPU
machine, which has no SGLang): the actor's training step and log-prob pass report positive, finite figures; the
staging check's second process reads the resharder's buffers (shared memory here), its sync verifies against
the Megatron shards before and after the staging memory is released and restored. What only CUDA can show
(CUDA IPC, memory readings, the reference model's offload) is reported as skipped, with that reason.
"""

import json
import math
import sys

import pytest

from distflow.testing.launch import REPO_ROOT, run

sys.path.insert(0, str(REPO_ROOT / "tools"))

from gpu_checks import flops  # noqa: E402 - tools/ is not a package: on sys.path above

SCRIPT = REPO_ROOT / "tools" / "gpu_check.sh"
TRAIN_FIGURES = (
    "build_s",
    "logprob_s",
    "logprob_tokens_per_s",
    "logprob_tflops",
    "train_s",
    "train_tokens_per_s",
    "train_tflops",
    "tokens",
    "padded_tokens",
    "micro_batches",
    "parameters",
)
STAGING_FIGURES = ("sync_s", "sync_gbps", "device_copy_gbps", "second_process_copy_gbps", "verified_sync_s")


def test_flops_by_hand():
    # One row of 2 tokens, 10 matmul parameters, 1 layer of attention width 4: 2*10*2 + 4*1*4*2*2.
    assert flops.forward_flops([2], matmul_parameters=10, layers=1, attention_width=4) == 104
    assert flops.train_flops([2, 2], matmul_parameters=10, layers=1, attention_width=4) == 3 * 208


@pytest.mark.slow
def test_cpu_smoke(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    out = tmp_path / "out"
    run(
        ["bash", str(SCRIPT), "--wheels", str(wheels), "--out", str(out), "--cpu-smoke", "--budget-s", "120"],
        timeout_s=120,
        env={"GPU_CHECK_SGLANG_STAND_IN": "1", "PYTHON": sys.executable},
    )
    result = json.loads((out / "gpu_check.json").read_text())
    errors = {name: r["error"] for name, r in result.items() if isinstance(r, dict) and "error" in r}
    assert not errors, errors
    assert result["environment"]["sglang"] == "stand-in"

    train = result["train_tiny"]
    for name in TRAIN_FIGURES:
        assert math.isfinite(train[name]) and train[name] > 0, (name, train[name])
    assert train["logprobs_finite"] and train["loss_finite"] and train["skipped_steps"] == 0
    assert train["padded_tokens"] >= train["tokens"]
    assert train["micro_batches"] > 1  # the token budget packs the rows into several micro-batches

    staging = result["staging"]
    assert staging["verified"] and staging["verified_after_restore"]
    assert staging["received_bytes"] == staging["bytes"] > 0
    assert staging["buckets"] > 1
    for name in STAGING_FIGURES:
        assert math.isfinite(staging[name]) and staging[name] > 0, (name, staging[name])
    # CPU staging buffers are torch shared-memory files: gone once released (a handle made for no reader
    # would keep them), back once the next sync allocates them.
    shared = {point: reading["shared_memory_mib"] for point, reading in staging["staging_memory"].items()}
    assert shared["staged"] > shared["before"] and shared["restored"] > shared["before"], shared
    assert shared["released"] == shared["before"], shared

    memory = result["memory"]
    assert "needs CUDA" in memory["ref_offload"]
    assert memory["actor"]["parameters_gib"] > 0 and memory["actor"]["adam_states_gib"] > 0
    assert result["total_s"] < 120
