"""rollout.stream_chunks on the real product (`distflow.train`, disaggregated, lock-step: one Megatron training
rank, one SGLang engine rank, GRPO with a KL reference and two mini-batches, so both the old- and the
reference-log-prob passes run, and a rollout correction against the old log-probs): the samples reach the
training rank in parts while the engine still generates, and the passes run on them there.

- Same result: every non-timing metric of the streamed job equals the unstreamed job's (stream_chunks=1),
  step by step, to float rounding (the passes run on other batch shapes).
- The overlap, from the recorded timeline: the training rank's stream_logprobs rows (one per early part)
  start before the engine rank's generate node ends (the engine runs 4 requests at a time, so the groups
  finish in waves); perf/logprobs_streamed is the share of samples whose
  passes ran early (3 of 4 prompt groups: the last part moves with the hand-off).
- An engine that dies mid-stream: in the streamed job the scorer kills the engine as it scores step 2's
  first group, after that group's samples left in the first part. The engine restarts, its remaining parts
  leave at once, the training rank drops the log-probs it computed on them, every rank syncs the weights
  into the new engine, and the rollout is generated again with its own weights and seeds: step 2 still
  equals the unstreamed job's (its passes all ran at the hand-off: perf/logprobs_streamed 0).
"""

import json
import os
from pathlib import Path

import pytest

from distflow.testing.copy_task import comparable_metrics, copy_task, disaggregated_test_job_args
from distflow.testing.launch import torchrun

TOL = 1e-5  # the log-probs of a sample in a part's forward vs the whole batch's: other padding, other sums
KILLED_AT_SCORE = 17  # 16 samples a step


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stream")
    model, data = copy_task(tmp, train=64)
    common = [
        *disaggregated_test_job_args(model, data),
        "actor.mini_batch_size=2",  # two optimizer steps a batch: the old-log-prob pass runs
        "algorithm.kl_coef=0.01",  # the reference pass runs
        # decoupled PPO with token TIS and a sequence mask: the proximal policy is the old-log-prob pass's
        "algorithm.rollout_correction.is_level=token",
        "algorithm.rollout_correction.mask_level=sequence",
        "trainer.total_steps=2",
        "checkpoint.save_every=0",
        # The engine decodes 4 of the 16 samples at a time, so prompt groups finish in waves and the first
        # parts leave well before the last wave (all at once, they finish in the same decode step, and the
        # overlap would be the few milliseconds of sending the parts).
        "rollout.sglang.max_running_requests=4",
    ]
    outs = {}
    for chunks in (4, 1):
        outs[chunks] = tmp / f"chunks{chunks}"
        # The copy task's scorer, which in the streamed job kills the engine at its 17th call: step 2's first.
        env = {
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
            "DISTFLOW_TEST_KILL_COUNTER": str(tmp / f"scores{chunks}"),
            "DISTFLOW_TEST_KILL_AT": str(KILLED_AT_SCORE if chunks > 1 else 0),
        }
        log = torchrun(
            "distflow.train",
            nproc=2,
            module=True,
            timeout_s=600,
            env=env,
            args=[
                *common,
                f"trainer.output_dir={outs[chunks]}",
                f"rollout.stream_chunks={chunks}",
                "reward.custom=engine_killing_scorer:score",
            ],
        )
        streams = "the log-prob passes of actor and ref run on each part as it arrives" in log
        assert streams == (chunks > 1), log[-3000:]
        if chunks > 1:
            assert "[rollout] engine 0 died in step 2's rollout" in log, log[-3000:]
            assert (
                "[rollout] step 2's rollout was lost (rank 1: engine 0: SGLang engine: engine process"
            ) in log, log[-3000:]
            assert "with the weights it was started with: the same samples" in log, log[-3000:]
    return outs


def _rows(out) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def _timeline(out, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / "timeline" / f"rank{rank}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_streamed_passes_give_the_unstreamed_result(jobs):
    streamed, whole = _rows(jobs[4]), _rows(jobs[1])
    assert sorted(streamed) == sorted(whole) == [1, 2]
    assert [streamed[step]["rollout/engine_restarts"] for step in (1, 2)] == [0, 1]
    for step in (1, 2):
        # step 2's parts were dropped with the engine that generated them
        assert streamed[step]["perf/logprobs_streamed"] == (0.75 if step == 1 else 0.0), streamed[step]
        assert "perf/logprobs_streamed" not in whole[step]
        keys = comparable_metrics(whole[step]).keys()
        assert keys == comparable_metrics(streamed[step]).keys()
        assert {
            "actor/kl",
            "rollout_corr/logprob_abs_diff",
            "rollout_corr/kl",
            "rollout_corr/ppl_ratio",
        } <= keys
        # Engine and trainer hold the same weights: the importance weights are 1 up to numerics.
        assert abs(whole[step]["rollout_corr/is_weight_mean"] - 1.0) <= 1e-3, whole[step]
        assert whole[step]["rollout_corr/is_weight_max"] <= 1.0 + 1e-3, whole[step]
        assert whole[step]["rollout_corr/masked_fraction"] == 0.0, whole[step]
        assert whole[step]["rollout_corr/logprob_abs_diff_max"] <= 1e-3, whole[step]
        for n in sorted(keys):
            a, b = streamed[step][n], whole[step][n]
            assert abs(a - b) <= TOL * max(1.0, abs(b)), (step, n, a, b)


@pytest.mark.slow
def test_the_passes_ran_while_the_engine_generated(jobs):
    timelines = {rank: _timeline(jobs[4], rank) for rank in (0, 1)}
    (trainer,) = [r for r, rows in timelines.items() if any(x["node"] == "stream_logprobs" for x in rows)]
    engine = 1 - trainer
    parts = [r for r in timelines[trainer] if r["step"] == 1 and r["node"] == "stream_logprobs"]
    assert len(parts) == 3 and sum(p["samples"] for p in parts) == 12, parts
    (generate,) = [r for r in timelines[engine] if r["step"] == 1 and r["node"] == "generate"]
    assert generate["start"] < parts[0]["start"] < generate["end"], (parts[0], generate)
    # Step 2: the first part left before the engine died (the kill came with its group's first score); the
    # others left at once when it did. Its rollout was generated twice.
    parts = [r for r in timelines[trainer] if r["step"] == 2 and r["node"] == "stream_logprobs"]
    assert len(parts) == 3 and parts[0]["samples"] >= 4, parts
    generates = [r for r in timelines[engine] if r["step"] == 2 and r["node"] == "generate"]
    assert len(generates) == 2, generates
    assert not any(r["node"] == "stream_logprobs" for r in _timeline(jobs[1], trainer))
