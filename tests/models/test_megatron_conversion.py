"""HF checkpoints loaded into Megatron GPTModel (via distflow.models) give HF's logits, at TP 1 and TP 2.

Each torchrun job loads every model; see tests/models/jobs/megatron_vs_hf_logits.py for what it checks.
"""
import json
from pathlib import Path

import pytest

from distflow.models.registry import DENSE_FAMILIES
from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import torchrun

JOB = Path(__file__).parent / "jobs" / "megatron_vs_hf_logits.py"
MAX_ABS_DIFF = 1e-4  # fp32; measured ~3e-6 with logits of magnitude ~4


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dirs, tmp_path_factory) -> list:
    # vocab 300 pads to 384 (TP1) / 512 (TP2) rows, and one KV head makes TP2 split a single query group:
    # Megatron's path for more TP ranks than KV heads; the tied output layer is padded too.
    odd = make_tiny_model("qwen2", tmp_path_factory.mktemp("odd") / "qwen2_vocab300_kv1", vocab=300, kv_heads=1)
    return [tiny_model_dirs[f] for f in DENSE_FAMILIES] + [odd]


@pytest.mark.slow
@pytest.mark.parametrize("tp_size", [1, 2])
def test_megatron_logits_equal_hf(model_dirs, tp_size, tmp_path):
    out = tmp_path / "result.json"
    torchrun(JOB, nproc=tp_size, args=["--out", out, *model_dirs], timeout_s=300)
    results = json.loads(out.read_text())
    assert sorted(results) == sorted(Path(d).name for d in model_dirs)
    for name, result in results.items():
        assert result["roundtrip_exact"], f"{name} TP{tp_size}: Megatron state -> HF differs from the checkpoint"
        assert result["max_abs_diff"] <= MAX_ABS_DIFF, f"{name} TP{tp_size}: {result}"
