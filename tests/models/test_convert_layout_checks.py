"""tools/convert_hf_to_megatron.py names the size that does not divide the model (heads, KV heads, layers,
experts) before it starts any rank."""

import os
import subprocess
import sys

import pytest

from distflow.models.checkpoint_import import CheckpointLayout
from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import REPO_ROOT

DENSE = {
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "vocab_size": 300,
}
MOE = {**DENSE, "num_hidden_layers": 2, "num_experts": 4}


@pytest.mark.parametrize(
    "layout, config, words",
    [
        (CheckpointLayout(tp=3), DENSE, "--tp 3 does not divide the model's 4 attention heads"),
        (CheckpointLayout(tp=4), DENSE, "--tp 4 does not divide the model's 2 KV heads"),
        (CheckpointLayout(pp=2), DENSE, "3 layers do not split evenly over --pp 2"),
        (CheckpointLayout(ep=3), MOE, "--ep 3 does not divide the model's 4 experts"),
    ],
)
def test_layout_names_what_does_not_divide(layout, config, words):
    with pytest.raises(ValueError, match=words):
        layout.validate(config)


def test_tool_refuses_tp3_before_starting_ranks(tmp_path):
    hf = make_tiny_model("qwen2", tmp_path / "hf", vocab=300, heads=4, kv_heads=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [
            sys.executable,
            REPO_ROOT / "tools" / "convert_hf_to_megatron.py",
            "--hf",
            hf,
            "--out",
            tmp_path / "ckpt",
            "--tp",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--tp 3 does not divide the model's 4 attention heads" in proc.stderr
    assert "torch.distributed.run" not in proc.stderr and not (tmp_path / "ckpt").exists()
