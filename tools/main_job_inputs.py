"""The README main job's model and data (ci/quickstart.sh makes the same ones), for the tools that run that
job outside the quickstart: tools/bench_async_learning.py and tools/validate_simulator.py."""

import sys

from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import REPO_ROOT, run

MODEL = REPO_ROOT / "outputs" / "tiny-qwen2-h128"
DATA = REPO_ROOT / "outputs" / "data" / "copy"


def prepare_main_job_inputs() -> None:
    """Makes the model and data where they are missing, with ci/quickstart.sh's arguments (a few seconds)."""
    if not (MODEL / "model.safetensors").is_file():
        make_tiny_model("qwen2", MODEL, vocab=300, hidden=128, ffn=512, heads=4, kv_heads=2)
    if not (DATA / "train.parquet").is_file():
        run(
            [sys.executable, REPO_ROOT / "tools/prepare_data.py", "copy", "--out", DATA, "--digits", "4"]
            + ["--train", "9000", "--test", "64", "--seed", "1"],
            timeout_s=300,
        )
