"""Exact resume of the real product (`distflow.train`, 2 CPU processes, Megatron actor at TP=2, one SGLang
engine per rank, GRPO on the tiny copy task): 4 steps straight vs the same job under `torchrun
--max-restarts 1` whose first attempt loses a rank (SIGKILL) after its step-2 checkpoint: torchrun starts it
again, the new attempt re-forms its process groups (no stale peers of the dead one) and resumes from step 2
by itself (checkpoint.resume=auto). Steps 3 and 4 must give the same metrics (<= 1e-6) and the same final
weights, and metrics.jsonl must hold each step once. This needs every piece of state: Megatron model + Adam state + LR schedule, each rank's RNG and
prompt-loader position, the engines' weights (synced from the restored actor), and sampling seeds that are a
function of (trainer.seed, step, sample) rather than of what the engine generated before; with a KL term, the
reference made from the warmed-up actor as well. The last checkpoint, exported by tools/convert_megatron_to_hf.py,
is byte for byte the trainer's own final export (<output_dir>/hf).
"""

import json
import os
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from distflow.testing.copy_task import comparable_metrics, copy_task
from distflow.testing.launch import REPO_ROOT, run, torchrun

TO_HF = REPO_ROOT / "tools" / "convert_megatron_to_hf.py"

TOL = 1e-6
SCORER_ON_PATH = {
    "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
}


def _records(path):
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow
def test_resume_gives_the_same_steps(tmp_path):
    model, data = copy_task(tmp_path, train=200)
    common = [
        "examples/configs/grpo_copy_cpu.yaml",
        f"model.path={model}",
        f"data.train_files=[{data}/train.parquet]",
        f"data.val_files=[{data}/test.parquet]",
        "data.train_batch_size=4",
        "data.val_batch_size=8",
        "rollout.n=4",
        "rollout.max_new_tokens=6",
        "trainer.total_steps=4",
        "trainer.val_every=2",
        "trainer.sft_warmup_steps=2",
        "checkpoint.save_every=2",
        "checkpoint.export_hf=true",
        # A KL term: the reference is the warmed-up actor's copy, which the checkpoint must carry too.
        "algorithm.kl_coef=0.05",
        "reward.custom=rank_killing_scorer:score",  # the copy reward; a rank killer where the test asks
    ]
    straight = tmp_path / "straight"
    torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=900,
        env=SCORER_ON_PATH,
        args=[*common, f"trainer.output_dir={straight}"],
    )
    assert (straight / "checkpoints" / "latest").read_text().strip() == "step_4"
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == ["latest", "step_2", "step_4"]
    # The last step's checkpoint exports to what the trainer itself exported at the end, byte for byte.
    exported = tmp_path / "exported"
    run([sys.executable, TO_HF, "--megatron", straight / "checkpoints", "--out", exported, "--no-progress"])
    assert {p.name: p.read_bytes() for p in exported.iterdir()} == {
        p.name: p.read_bytes() for p in (straight / "hf").iterdir()
    }

    # The same job, restarted by torchrun after a rank of its first attempt is killed past step 2's checkpoint.
    resumed = tmp_path / "resumed"
    out = torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=900,
        max_restarts=1,
        env={**SCORER_ON_PATH, "DISTFLOW_TEST_KILL_AFTER": str(resumed / "checkpoints" / "latest")},
        args=[*common, f"trainer.output_dir={resumed}"],
    )
    assert "exitcode  : -9" in out or "exitcode: -9" in out, out[-3000:]  # the first attempt lost a rank
    assert "resumed from" in out and out.count("supervised warm-up") == 1, out[-3000:]
    assert "this is a restarted attempt (1 torchrun restart(s), 0 SLURM requeue(s) so far)" in out, out[
        -3000:
    ]

    a, b = _records(straight / "metrics.jsonl"), _records(resumed / "metrics.jsonl")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    assert len((resumed / "metrics.jsonl").read_text().splitlines()) == 4
    assert [a[s]["trainer/restarts"] for s in (1, 2, 3, 4)] == [0, 0, 0, 0]
    assert [b[s]["trainer/restarts"] for s in (1, 2, 3, 4)] == [0, 0, 1, 1]  # steps 3, 4: the second attempt
    for step in (3, 4):
        keys = comparable_metrics(a[step]).keys()
        assert keys == comparable_metrics(b[step]).keys()
        assert {"reward/mean", "actor/pg_loss", "actor/kl", "rollout/weight_version"} <= keys
        for k in sorted(keys):
            assert abs(a[step][k] - b[step][k]) <= TOL * max(1.0, abs(a[step][k])), (
                step,
                k,
                a[step][k],
                b[step][k],
            )
    final_a, final_b = (
        load_file(straight / "hf" / "model.safetensors"),
        load_file(resumed / "hf" / "model.safetensors"),
    )
    for name, tensor in final_a.items():
        assert (tensor - final_b[name]).abs().max() <= TOL, name
