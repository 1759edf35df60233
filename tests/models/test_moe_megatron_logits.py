"""MoE HF checkpoints loaded into Megatron GPTModel (SequentialMLP experts) give HF's logits at TP1, EP2
(alltoall dispatcher), TP2 (allgather dispatcher) and TP2 x EP2 with ETP1; PP2 is covered by
test_convert_tools (a TP2 x EP2 checkpoint loaded at PP2). See tests/models/jobs/parallel_vs_hf_logits.py.
"""
import json
from pathlib import Path

import pytest

from distflow.models.registry import MOE_FAMILIES
from distflow.testing.launch import torchrun

JOB = Path(__file__).parent / "jobs" / "parallel_vs_hf_logits.py"
MAX_ABS_DIFF = 1e-4  # fp32; measured 2.4e-6 .. 4.2e-6 with logits of magnitude ~4

LAYOUTS = {  # name: (processes, job arguments, families)
    "tp1": (1, ["--tp", "1"], MOE_FAMILIES),
    "ep2": (2, ["--ep", "2", "--dispatcher", "alltoall"], MOE_FAMILIES),
    "tp2": (2, ["--tp", "2", "--dispatcher", "allgather"], MOE_FAMILIES),
    "tp2_ep2_etp1": (2, ["--tp", "2", "--ep", "2", "--etp", "1"], ("qwen3_moe",)),
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_moe_megatron_logits_equal_hf(tiny_model_dirs, layout, tmp_path):
    nproc, job_args, families = LAYOUTS[layout]
    out = tmp_path / "result.json"
    torchrun(JOB, nproc=nproc, args=[*job_args, "--out", out, *(tiny_model_dirs[f] for f in families)],
             timeout_s=300)
    results = json.loads(out.read_text())
    assert sorted(results) == sorted(families)
    for name, result in results.items():
        assert result["roundtrip_exact"], f"{name} {layout}: gathered Megatron state -> HF differs from the checkpoint"
        assert result["max_abs_diff"] <= MAX_ABS_DIFF, f"{name} {layout}: {result}"
