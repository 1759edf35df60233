"""Bounded staleness on the real product (`distflow.train`, disaggregated: one Megatron training rank, one
SGLang engine rank, GRPO on the tiny copy task), at rollout.max_staleness 1 and 2.

- The bound, from the per-sample weight versions: step t trains on samples exactly min(t - 1, k) versions old
  (the engines generate the next k batches while a step trains), never more.
- Exact resume with rollouts in flight: the step-2 checkpoint holds the batches generated for steps 3..2+k; a
  fresh job resumed from it gives steps 3 and 4 the straight run's metrics (<= 1e-6).
- Resumed with a smaller bound (k=2's checkpoint at k=1), the batches that would be too old are dropped and
  generated again (rollout/stale_dropped) and no step trains on samples older than the new bound; that run
  has partial rollouts on, so its last batch stays in flight through a weight sync, and a rollout correction
  (decoupled PPO with token TIS): its importance weights move away from 1 on the stale samples.
- With partial rollouts, the engine dies twice holding submitted rollouts' requests (found dead by the next
  submit or sync; then under the collection before a checkpoint): it restarts, and their unfinished
  requests move to the new engine and are re-issued after the sync that loads its weights; the rollouts
  lost in the collection are generated again by the steps that take them. Every step trains on its whole
  batch, with no job restart.
- The engine dies as it starts generating, with no other engine to take its prompts: under step 1's rollout
  (generated when step 1 takes it, as in lock-step) and under step 3's (generated ahead while step 2
  trains). It restarts; each rollout is generated again by the step that takes it, after every rank synced
  the actor's weights into it (checked by sync.verify). Step 1's has its own weights back: the run stays
  the straight run's; step 3's is generated with step 3's newer weights (staleness 0), and step 4's samples
  are the straight run's again. In the same run the engine dies once more while its rank holds rollout 4,
  generated ahead: step 3's weight sync finds it dead, every rank hears so, the engine restarts and the
  sync runs again.
"""

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from distflow.testing.copy_task import comparable_metrics, copy_task, disaggregated_test_job_args
from distflow.testing.launch import torchrun
from distflow.testing.phase_faults import fault_env

TOL = 1e-6
SAMPLES = 16  # data.train_batch_size x rollout.n


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("async")
    model, data = copy_task(tmp, train=64)
    common = [
        *disaggregated_test_job_args(model, data),
        "trainer.total_steps=4",
        "checkpoint.save_every=2",
    ]
    return tmp, common


def _train(common, out, *extra, env=None):
    return torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=600,
        env=env,
        args=[*common, f"trainer.output_dir={out}", *extra],
    )


def _killing_engine_at(score: int, counter: Path) -> tuple[str, dict]:
    """_train's arguments for a job whose `score`-th reward call kills its engine (engine_killing_scorer)."""
    env = {
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        "DISTFLOW_TEST_KILL_COUNTER": str(counter),
        "DISTFLOW_TEST_KILL_AT": str(score),
    }
    return "reward.custom=engine_killing_scorer:score", env


def _straight_k1(tmp) -> dict[int, dict]:
    """test_staleness_bound_and_exact_resume_in_flight[1]'s run, to compare with (skips if it did not run)."""
    straight = tmp / "straight_k1"
    if not (straight / "metrics.jsonl").is_file():
        pytest.skip("the k=1 run did not run first: no run to compare the metrics with")
    return _rows(straight)


def _assert_same(mine: dict, theirs: dict, step: int) -> None:
    assert mine.keys() == theirs.keys(), sorted(mine.keys() ^ theirs.keys())
    for n in sorted(mine):
        assert abs(mine[n] - theirs[n]) <= TOL * max(1.0, abs(theirs[n])), (step, n, mine[n], theirs[n])


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
        assert (r["rollout_corr/logprob_abs_diff"] > 1e-3) == (step > 1), r
        assert 0 <= r["perf/engine_idle_ratio"] <= 1 and 0 <= r["perf/trainer_idle_ratio"] <= 1, r
    assert {"timing_s/hand_off", "timing_s/generate", "timing_s/train_actor"} <= set(rows[2])

    resumed = tmp / f"resumed_k{k}"
    log = _resume(common, straight, resumed, f"rollout.max_staleness={k}")
    assert "resumed from" in log, log[-3000:]
    b = _rows(resumed)
    for step in (3, 4):
        keys = comparable_metrics(rows[step]).keys()
        assert keys == comparable_metrics(b[step]).keys()
        for n in sorted(keys):
            assert abs(rows[step][n] - b[step][n]) <= TOL * max(1.0, abs(rows[step][n])), (
                step,
                n,
                rows[step][n],
                b[step][n],
            )

    if k == 2:  # the same checkpoint, resumed under a tighter bound, with partial rollouts, one step longer
        tighter = tmp / "tighter"
        log = _resume(
            common,
            straight,
            tighter,
            "rollout.max_staleness=1",
            "rollout.partial=true",
            "trainer.total_steps=5",
            # decoupled PPO: clipped against the trainer's policy, weighed against the stale sampling one
            "algorithm.rollout_correction.is_level=token",
        )
        assert "partial rollouts: the weight sync interrupts the generation in flight" in log, log[-3000:]
        c = _rows(tighter)
        for step in (3, 4):
            # Both batches ahead were 2 versions old by their step: dropped and generated again there, with the
            # current weights.
            assert c[step]["rollout/stale_dropped"] == SAMPLES, c[step]
            assert c[step]["rollout/staleness_max"] <= 1, c[step]
        # Step 5's batch was submitted in step 4 and stayed in flight through its sync (a sync that found it
        # unfinished interrupted it: rollout/partial_fraction > 0 then).
        assert c[5]["rollout/stale_dropped"] == 0 and c[5]["rollout/samples"] == SAMPLES, c[5]
        assert c[5]["rollout/staleness_max"] <= 1 and 0 <= c[5]["rollout/partial_fraction"] <= 1, c[5]
        # Step 3's batch was generated again with the current weights: its importance weights are 1 up to
        # numerics; step 5's is one version old: they leave 1 (and stay under the cap).
        assert abs(c[3]["rollout_corr/is_weight_mean"] - 1.0) <= 1e-3, c[3]
        assert abs(c[5]["rollout_corr/is_weight_mean"] - 1.0) > 1e-4, c[5]
        assert 0 < c[5]["rollout_corr/is_weight_max"] <= 2.0 and c[5]["rollout_corr/kl"] > 1e-6, c[5]


@pytest.mark.slow
def test_an_engine_dying_mid_rollout_or_in_a_sync_restarts_in_place(task):
    tmp, common = task
    out = tmp / "engine_dies"
    # Three deaths, k=1, 16 scores a rollout. The engine is killed as step 1's rollout starts (generated
    # when step 1 takes it) and as step 3's starts (generated ahead while step 2 trains). Then step 3 takes
    # rollout 3 (scores 33-48) and generates rollout 4 ahead, whose first score, the 49th, kills the engine
    # once more: the next engine call, step 3's weight sync, fails on the engine rank while the training rank
    # is in it; both hear it in the sync's exchange, and the sync runs again into the restarted engine.
    scorer, env = _killing_engine_at(49, tmp / "scores")
    env.update(fault_env("generate", "1,3", rank=1, sig="ENGINE"))
    start = time.monotonic()
    log = _train(
        common,
        out,
        "rollout.max_staleness=1",
        "rollout.engine_restarts=3",
        "sync.verify=true",
        "dag.pipeline=distflow.testing.phase_faults:pipeline",
        scorer,
        env=env,
    )
    seconds = time.monotonic() - start
    for step in (1, 3):
        assert f"[phase_faults] rank 1: engine killed in generate of step {step}" in log, log[-3000:]
        assert f"[rollout] engine 0 died in step {step}'s rollout" in log, log[-3000:]
        assert f"[rollout] step {step}'s rollout was lost (rank 1: engine 0: " in log, log[-3000:]
    assert "with the weights it was started with: the same samples" in log, log[-3000:]  # step 1's
    assert "with newer weights than the version 2 it was started with" in log, log[-3000:]  # step 3's
    assert "weight sync to version 4 failed on rank 1: EngineDiedError" in log, log[-3000:]
    assert "restarting the engine and syncing again" in log, log[-3000:]
    assert "restarted attempt" not in log and seconds < 300, (seconds, log[-3000:])  # no job restart
    rows = _rows(out)
    assert sorted(rows) == [1, 2, 3, 4], sorted(rows)
    assert [rows[s]["rollout/engine_restarts"] for s in (1, 2, 3, 4)] == [1, 2, 3, 3]
    reference = _straight_k1(tmp)
    for step in (1, 2):  # step 1's rollout generated again with its own weights and seeds: the same run
        _assert_same(comparable_metrics(rows[step]), comparable_metrics(reference[step]), step)
    # Step 3's rollout, lost ahead, was generated with the weights step 3 trains (version 3: the warm-up's
    # sync, then steps 1 and 2's) instead of step 2's.
    assert rows[3]["rollout/staleness_max"] == 0 and rows[3]["rollout/weight_version"] == 3, rows[3]
    assert reference[3]["rollout/staleness_max"] == 1 and reference[3]["rollout/weight_version"] == 2
    assert rows[3]["rollout/samples"] == SAMPLES and rows[3]["rollout/stale_dropped"] == 0, rows[3]

    # Step 4's was generated ahead in step 3 from the same weights (version 3) and seeds as the straight
    # run's, before the death in step 3's sync: the same samples and rewards, trained by an actor that
    # differs since step 3 (its entropy too).
    def of_samples(row):
        return {
            k: v
            for k, v in comparable_metrics(row).items()
            if k.startswith(("rollout/", "reward/")) and k != "rollout/actor_entropy"
        }

    assert len(of_samples(rows[4])) > 10, sorted(of_samples(rows[4]))
    _assert_same(of_samples(rows[4]), of_samples(reference[4]), 4)


@pytest.mark.slow
def test_an_engine_dying_with_partial_rollouts_in_flight_restarts_and_reissues_their_requests(task):
    tmp, common = task
    out = tmp / "engine_dies_partial"
    # k=2, partial, a checkpoint at step 2; 16 scores a rollout; responses of up to 64 tokens, so that a
    # rollout's requests take a while after each sync continues them. Step 1 submits rollouts 2 and 3. Step 2
    # collects rollout 2, whose first score (the 17th) kills the engine with rollout 3 in it: submitting
    # rollout 4, or step 2's sync, finds it dead. After that sync the checkpoint's settle collects rollouts 3
    # and 4, their requests continued on the restarted engine, and the engine is killed again as it starts.
    # Rollout 3 is lost if it still had requests there (then rollout 4 with it), else rollout 4 is; the
    # steps that take them generate them again.
    scorer, env = _killing_engine_at(17, tmp / "scores_partial")
    env.update(fault_env("generate", 3, rank=1, sig="ENGINE"))
    start = time.monotonic()
    log = _train(
        common,
        out,
        "rollout.max_staleness=2",
        "rollout.partial=true",
        "rollout.max_new_tokens=64",
        "sync.verify=true",
        "dag.pipeline=distflow.testing.phase_faults:pipeline",
        scorer,
        env=env,
    )
    seconds = time.monotonic() - start
    assert "restarted attempt" not in log and seconds < 300, (seconds, log[-3000:])  # no job restart
    assert re.search(
        r"\[rollout\] engine 0 is dead \(engine process \d+ .*\); it restarts \(1 of "
        r"rollout.engine_restarts=2\); the unfinished requests of the rollouts of steps \[3(, 4)?\] in "
        "flight on it are re-issued after the next weight sync",
        log,
    ), log[-3000:]
    assert "[phase_faults] rank 1: engine killed in generate of step 3" in log, log[-3000:]
    died = re.search(
        r"\[rollout\] engine 0 died in step (3|4)'s rollout; it is generated again when that step takes it; "
        r"it restarts \(2 of rollout.engine_restarts=2\); the unfinished requests of the rollouts of steps "
        r"\[(3, )?4\] in flight on it are re-issued after the next weight sync",
        log,
    )
    assert died, log[-3000:]
    assert f"[rollout] step {died[1]}'s rollout was lost (rank 1: engine 0: " in log, log[-3000:]
    if died[1] == "3":  # the settle's later rollout is lost with it (the restarted engine serves no weights)
        assert "[rollout] step 4's rollout was lost (rank 1: its engine restarted in step 3's rollout" in log
    rows = _rows(out)
    assert sorted(rows) == [1, 2, 3, 4], sorted(rows)
    assert [rows[s]["rollout/engine_restarts"] for s in (1, 2, 3, 4)] == [0, 1, 2, 2]
    for step in (1, 2, 3, 4):  # every request finished: none lost, none cut short by the restarts
        row = rows[step]
        assert row["rollout/samples"] == SAMPLES and row["rollout/staleness_max"] <= 2, row
        assert 0 <= row["rollout/partial_fraction"] <= 1, row
        # a continuation asks only for what its request had left of rollout.max_new_tokens
        assert row["rollout/response_length/max"] <= 64, row
