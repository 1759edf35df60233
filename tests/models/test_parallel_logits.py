"""HF checkpoints of every family loaded into Megatron GPTModel give transformers' logits (<= 1e-4, fp32) at
every layout of the issue's matrix, and the gathered Megatron state converts back to the checkpoint bit for bit.

Dense families (llama, mistral, qwen2, qwen3, and a qwen2 with vocabulary 300 and one KV head: vocabulary
padding and more TP ranks than KV heads) at TP1, TP2, PP2 and TP2 x PP2; MoE families (mixtral, qwen2_moe,
qwen3_moe) at those and at EP2, EP2 x TP2 (ETP1) and EP2 x TP2 x ETP2. Each layout loads every family; one
torchrun per process count runs its layouts in turn (tests/models/jobs/parallel_vs_hf_logits.py).
"""

import json
from pathlib import Path

import pytest

from distflow.models.registry import DENSE_FAMILIES, MOE_FAMILIES
from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import torchrun

JOB = Path(__file__).parent / "jobs" / "parallel_vs_hf_logits.py"
MAX_ABS_DIFF = 1e-4  # fp32; measured 2.4e-6 .. 4.2e-6 over all layouts, logits of magnitude ~4-5
ODD = "qwen2_vocab300_kv1"
DENSE = (*DENSE_FAMILIES, ODD)
ALL = (*DENSE, *MOE_FAMILIES)

LAYOUTS = {  # name: (processes, job arguments, models)
    "tp1": (1, ["--tp", "1"], ALL),
    "tp2": (2, ["--tp", "2", "--dispatcher", "allgather"], ALL),  # the other MoE token dispatcher
    "pp2": (2, ["--pp", "2"], ALL),
    "tp2_pp2": (4, ["--tp", "2", "--pp", "2"], ALL),
    "ep2": (2, ["--ep", "2"], MOE_FAMILIES),
    "ep2_tp2_etp1": (2, ["--tp", "2", "--ep", "2", "--etp", "1"], MOE_FAMILIES),
    "ep2_tp2_etp2": (4, ["--tp", "2", "--ep", "2", "--etp", "2"], MOE_FAMILIES),  # expert DP 1, dense DP 2
}


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dirs, tmp_path_factory) -> dict:
    # vocab 300 pads to 384 (TP1) / 512 (TP2) rows, and one KV head makes TP2 split a single query group:
    # Megatron's path for more TP ranks than KV heads; the tied output layer is padded too.
    odd = make_tiny_model("qwen2", tmp_path_factory.mktemp("odd") / ODD, vocab=300, kv_heads=1)
    return {**tiny_model_dirs, ODD: odd}


@pytest.fixture(scope="module")
def layout_results(model_dirs, tmp_path_factory) -> dict:
    """layout -> the job's results: one torchrun per process count runs all its layouts (the ranks' start-up,
    torch and Megatron, paid once per count), each layout with Megatron's groups and the RNGs set up afresh."""
    root = tmp_path_factory.mktemp("logits")
    results = {}
    for nproc in sorted({n for n, _, _ in LAYOUTS.values()}):
        layouts = [name for name, (n, _, _) in LAYOUTS.items() if n == nproc]
        args = []
        for name in layouts:
            _, job_args, models = LAYOUTS[name]
            args += [
                *(["--then"] if args else []),
                *job_args,
                "--out",
                root / f"{name}.json",
                *(model_dirs[m] for m in models),
            ]
        torchrun(JOB, nproc=nproc, args=args, timeout_s=420 * len(layouts))
        results.update({name: json.loads((root / f"{name}.json").read_text()) for name in layouts})
    return results


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_logits_equal_hf(layout_results, layout):
    _, _, models = LAYOUTS[layout]
    results = layout_results[layout]
    assert sorted(results) == sorted(models)
    diffs = ", ".join(f"{n} {r['max_abs_diff']:.1e}" for n, r in results.items())
    print(f"{layout}: max |Megatron - HF| logit {diffs}")
    for name, result in results.items():
        assert result["roundtrip_exact"], (
            f"{name} {layout}: gathered Megatron state -> HF differs from the checkpoint"
        )
        assert result["max_abs_diff"] <= MAX_ABS_DIFF, f"{name} {layout}: {result}"
