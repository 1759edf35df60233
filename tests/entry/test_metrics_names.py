"""A short GRPO run on the copy task (2 CPU ranks) writes the metric names docs/metrics.md documents, with
max/min reduced as max/min (reward/max is a reward a sample can have, not a mean of per-rank maxima),
validation per data_source, the validation sample table and the profiler traces of trainer.profile_steps."""
import json

import pytest

from distflow.testing.copy_task import copy_task, metrics_rows
from distflow.testing.launch import torchrun

DOCUMENTED = ["timing_s/generate", "timing_s/train_actor", "timing_s/step", "perf/time_per_step", "perf/throughput",
              "perf/cpu_memory_used_gb", "rollout/samples", "rollout/tokens", "rollout/response_length/mean",
              "rollout/response_length/max", "rollout/response_length/min", "rollout/response_length/clip_ratio",
              "rollout/prompt_length/mean", "rollout/prompt_length/max", "rollout/prompt_length/min",
              "reward/mean", "reward/max", "reward/min", "reward/samples", "reward/errors",
              "reward/shaped/mean", "advantage/mean", "advantage/max", "advantage/min",
              "actor/pg_loss", "actor/pg_clipfrac", "actor/entropy", "actor/grad_norm", "sync/seconds"]


def _is_copy_reward(value: float) -> bool:
    """A copy-task reward is matches / max(len(output), 5): k/m for a small m (responses are <= 8 tokens)."""
    return any(abs(value * m - round(value * m)) < 1e-6 for m in range(1, 41))


@pytest.mark.slow
def test_short_run_logs_the_documented_names(tmp_path):
    model, data = copy_task(tmp_path, train=256, test=8)
    out = tmp_path / "run"
    torchrun("distflow.train", nproc=2, module=True, timeout_s=900, args=[
        "examples/configs/grpo_copy_cpu.yaml", f"model.path={model}", f"trainer.output_dir={out}",
        f"data.train_files=[{data}/train.parquet]", f"data.val_files=[{data}/test.parquet]",
        "trainer.total_steps=3", "trainer.val_every=2", "trainer.sft_warmup_steps=2", "data.train_batch_size=8",
        "trainer.profile_steps=[2]", "tracking.val_samples=4", "checkpoint.export_hf=false"])
    rows = metrics_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        missing = [name for name in DOCUMENTED if name not in row]
        assert not missing, (missing, sorted(row))
        assert row["reward/min"] <= row["reward/mean"] <= row["reward/max"], row
        assert _is_copy_reward(row["reward/max"]) and _is_copy_reward(row["reward/min"]), row
        assert row["rollout/samples"] == 8 * 8 and row["reward/samples"] == 8 * 8  # 8 prompts x rollout.n=8
        assert row["rollout/response_length/min"] <= row["rollout/response_length/max"] <= 8
    validated = [r for r in rows if "val/reward/mean" in r]
    assert [r["step"] for r in validated] == [1, 2]
    for row in validated:  # one data_source, "distflow/copy": its metrics equal the overall ones
        assert row["val/distflow/copy/reward/mean"] == pytest.approx(row["val/reward/mean"])
        assert row["val/accuracy"] == pytest.approx(row["val/distflow/copy/accuracy"])
        assert 0 <= row["val/accuracy"] <= 1
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 4 + [2] * 4
    assert all(_is_copy_reward(s["reward"]) and s["data_source"] == "distflow/copy" for s in samples)
    for rank in (0, 1):
        traces = list((out / "profile" / f"rank{rank}").glob(f"rank{rank}_step2.*.pt.trace.json"))
        assert len(traces) == 1 and json.loads(traces[0].read_text())["traceEvents"], rank
