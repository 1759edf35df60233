"""Bounded staleness on the real product (`distflow.train`, disaggregated: one Megatron training rank, one
SGLang engine rank, GRPO on the tiny copy task), at rollout.max_staleness 1 and 2.

- The bound, from the per-sample weight versions: step t trains on samples exactly min(t - 1, k) versions old
  (the engines generate the next k batches while a step trains), never more.
- Exact resume with rollouts in flight: the step-2 checkpoint holds the batches generated for steps 3..2+k; a
  fresh job resumed from it gives steps 3 and 4 the straight run's metrics (<= 1e-6).
- Resumed with a smaller bound (k=2's checkpoint at k=1), the batches that would be too old are dropped and
  generated again (rollout/stale_dropped) and no step trains on samples older than the new bound.
"""

import json
import shutil

import pytest

from distflow.testing.copy_task import copy_task
from distflow.testing.launch import torchrun

# Wall-clock metrics differ between any two runs; everything else must match.
_TIMED = ("timing_s/", "perf/", "sync/seconds", "sync/gbps", "rollout/seconds")
TOL = 1e-6
SAMPLES = 16  # data.train_batch_size x rollout.n


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("async")
    model, data = copy_task(tmp, train=64)
    common = [
        "examples/configs/grpo_copy_cpu.yaml",
        f"model.path={model}",
        f"data.train_files=[{data}/train.parquet]",
        "data.val_files=[]",
        "trainer.val_every=0",
        "rollout.placement=disaggregated",
        "rollout.num_ranks=1",
        "actor.tp=1",
        "trainer.sft_warmup_steps=1",
        "data.train_batch_size=4",
        "rollout.n=4",
        "rollout.max_new_tokens=6",
        "trainer.total_steps=4",
        "checkpoint.save_every=2",
        "checkpoint.export_hf=false",
    ]
    return tmp, common


def _train(common, out, *extra):
    return torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=600,
        args=[*common, f"trainer.output_dir={out}", *extra],
    )


def _rows(out) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def _resume(common, straight, out, *extra) -> str:
    out.mkdir()
    shutil.copy(straight / "metrics.jsonl", out / "metrics.jsonl")  # the resumed run continues it
    return _train(common, out, f"checkpoint.resume={straight / 'checkpoints' / 'step_2'}", *extra)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_staleness_bound_and_exact_resume_in_flight(task, k):
    tmp, common = task
    straight = tmp / f"straight_k{k}"
    log = _train(common, straight, f"rollout.max_staleness={k}")
    assert f"rollout.max_staleness={k}: the engines generate the batches of the next {k}" in log, log[-3000:]
    rows = _rows(straight)
    assert sorted(rows) == [1, 2, 3, 4]
    for step, r in rows.items():
        assert r["rollout/staleness_max"] == r["rollout/staleness_mean"] == min(step - 1, k), r
        assert r["rollout/samples"] == SAMPLES and r["rollout/stale_dropped"] == 0, r
        assert r["rollout/weight_version"] == max(1, step - k), r  # 1: the warm-up's sync
        # The engine sampled from older weights than the actor's: their log-probs differ from step 2 on.
        assert (r["rollout/logprob_diff_vs_actor"] > 1e-3) == (step > 1), r
        assert 0 <= r["perf/engine_idle_ratio"] <= 1 and 0 <= r["perf/trainer_idle_ratio"] <= 1, r
    assert {"timing_s/hand_off", "timing_s/generate", "timing_s/train_actor"} <= set(rows[2])

    resumed = tmp / f"resumed_k{k}"
    log = _resume(common, straight, resumed, f"rollout.max_staleness={k}")
    assert "resumed from" in log, log[-3000:]
    b = _rows(resumed)
    for step in (3, 4):
        keys = {n for n in rows[step] if n not in ("step", "time") and not n.startswith(_TIMED)}
        assert keys == {n for n in b[step] if n not in ("step", "time") and not n.startswith(_TIMED)}
        for n in sorted(keys):
            assert abs(rows[step][n] - b[step][n]) <= TOL * max(1.0, abs(rows[step][n])), (
                step,
                n,
                rows[step][n],
                b[step][n],
            )

    if k == 2:  # the same checkpoint, resumed under a tighter bound
        tighter = tmp / "tighter"
        _resume(common, straight, tighter, "rollout.max_staleness=1")
        c = _rows(tighter)
        for step in (3, 4):
            # Both batches ahead were 2 versions old by their step: dropped and generated again there, with the
            # current weights.
            assert c[step]["rollout/stale_dropped"] == SAMPLES, c[step]
            assert c[step]["rollout/staleness_max"] <= 1, c[step]
