"""A rank lost or frozen at a fixed point of a real job (the main job's shape: 2 CPU processes, actor TP=2,
one SGLang engine per rank) under `torchrun --max-restarts 1`: the job ends by itself within the bound,
restarted once, resumed from its last complete checkpoint, with metrics.jsonl holding steps 1..T once and
every checkpoint intact. distflow.testing.phase_faults arms the fault; tools/fault_inject.py --phase runs
the same faults at every phase (a rank killed while its checkpoint is written, too) and reports. Here the
two CI keeps: a frozen rank while training, and every engine killed while it generates, which needs no
job restart: the engines restart in place, the weights are synced into them again and the rollout is
generated again (one engine's death, whose chunks the other engine takes, is tests/rollout/
test_balanced_rollout.py's), and the run's metrics equal the frozen-rank run's (both equal the
uninterrupted run's).
"""

import re
import time

import pytest

from distflow.checkpointing.directory import CheckpointDirectory, structure_problems
from distflow.testing.copy_task import comparable_metrics, copy_task, metrics_rows, small_test_job_args
from distflow.testing.launch import torchrun
from distflow.testing.phase_faults import fault_env

BOUND_S = 30  # trainer.dist_timeout_s: a frozen rank stops the others within it
ROWS: dict[str, list[dict]] = {}  # case -> its metrics rows, for the engine case's comparison


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return copy_task(tmp_path_factory.mktemp("phase_faults"), train=64)


def run_job(task, out, node, sig, *extra, rank=1):
    model, data = task
    return torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=600,
        max_restarts=1,
        env=fault_env(node, step=2, rank=rank, sig=sig),
        args=[
            *small_test_job_args(model, data, out),
            "trainer.total_steps=3",
            "checkpoint.save_every=1",
            "checkpoint.keep_last=3",
            f"trainer.dist_timeout_s={BOUND_S}",
            "dag.pipeline=distflow.testing.phase_faults:pipeline",
            *extra,
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "node, sig",
    [("train_actor", "STOP")],
)
def test_the_job_restarts_and_resumes_after_a_fault(task, tmp_path, node, sig):
    out = tmp_path / "run"
    started = time.monotonic()
    log = run_job(task, out, node, sig)
    seconds = time.monotonic() - started
    what = "while saving step 2" if node == "checkpoint_save" else f"in {node} of step 2"
    assert f"[phase_faults] rank 1: SIG{sig} {what}" in log, log[-3000:]
    if sig == "STOP":  # every process group, Megatron's too, waits dist_timeout_s for the frozen rank
        waits = [int(ms) for ms in re.findall(r"Timed out waiting (\d+)ms", log)]
        assert waits and max(waits) <= BOUND_S * 1000, waits
    assert "this is a restarted attempt (1 torchrun restart(s)" in log, log[-3000:]
    assert "resumed from" in log, log[-3000:]  # step 1's checkpoint at least
    rows = ROWS[node] = metrics_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3], [r["step"] for r in rows]
    assert rows[-1]["trainer/restarts"] == 1
    checkpoints = CheckpointDirectory.of_run(out)
    for step in (1, 2, 3):
        assert not structure_problems(checkpoints.final(step)), step
    # Two start-ups (about 30 s each here), the bound for the frozen rank, and torchrun's grace.
    assert seconds < 4 * BOUND_S + 120, seconds


@pytest.mark.slow
def test_every_engine_killed_mid_rollout_restarts_in_place(task, tmp_path):
    """Both engines die as step 2's rollout starts: no live engine can take their chunks, so each restarts,
    every rank syncs the actor's weights into them again under the same version (checked by sync.verify),
    and each owner generates its prompts again with the same seeds."""
    out = tmp_path / "run"
    log = run_job(task, out, "generate", "ENGINE", "sync.verify=true", rank="all")
    for rank in (0, 1):
        assert f"[phase_faults] rank {rank}: engine killed in generate of step 2" in log, log[-3000:]
        assert f"[rollout] engine {rank} died in step 2's rollout" in log, log[-3000:]
    assert "restarted attempt" not in log, log[-3000:]  # no job restart
    rows = metrics_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3], [r["step"] for r in rows]
    assert [r["rollout/engine_restarts"] for r in rows] == [0, 2, 2]  # summed over the engines
    assert rows[-1]["trainer/restarts"] == 0
    reference = ROWS.get("train_actor")  # the same steps, resumed exactly after a frozen rank
    if reference is None:
        pytest.skip("the frozen-rank case did not run first: no run to compare the metrics with")
    for mine, theirs in zip(rows, reference):
        mine, theirs = comparable_metrics(mine), comparable_metrics(theirs)
        assert mine.keys() == theirs.keys() and len(mine) > 10, sorted(mine.keys() ^ theirs.keys())
        for k in mine:
            assert mine[k] == pytest.approx(theirs[k], rel=1e-5, abs=1e-6), (rows[0]["step"], k)
