"""The per-rank controller under torchrun: nodes run on every rank without a driver; a node failing on
one rank stops all ranks promptly with that rank's error."""

import json
import time
from pathlib import Path

import pytest

from distflow.testing.launch import JobFailed, torchrun

JOB = Path(__file__).parent / "jobs" / "pipeline_job.py"


@pytest.mark.slow
def test_pipeline_runs_on_every_rank(tmp_path):
    out = tmp_path / "result.json"
    torchrun(JOB, nproc=2, args=["--out", out], timeout_s=120)
    result = json.loads(out.read_text())
    assert result["total"] == sum(i * i for i in range(8))  # both ranks' shards, summed by the last node
    assert set(result["timing"]) == {"square", "explode", "total"}


@pytest.mark.slow
def test_failing_node_stops_every_rank_with_its_error():
    start = time.perf_counter()
    with pytest.raises(JobFailed) as err:
        torchrun(JOB, nproc=2, args=["--fail-rank", "1"], timeout_s=200)
    elapsed = time.perf_counter() - start
    assert "rank 1 failed in node 'explode': ValueError: deliberate failure for the test" in str(err.value)
    assert "rank 0 stopping" in str(err.value)
    # Bounded: far below the 300 s collective timeout rank 0 would otherwise wait out.
    assert elapsed < 120, elapsed


@pytest.mark.slow
def test_data_moves_between_layouts_through_the_coordinator(tmp_path):
    import sys

    sys.path.insert(0, str(JOB.parent))
    from moving_pipeline_job import GROUP, SAMPLES_PER_RANK, make_samples

    out = tmp_path / "moved.json"
    torchrun(JOB.parent / "moving_pipeline_job.py", nproc=2, args=["--out", out], timeout_s=180)
    result = json.loads(out.read_text())
    expected = {}
    for rank in range(2):
        batch = make_samples(rank)
        for i in range(len(batch)):
            expected[int(batch.sample_ids[i])] = batch.sample(i)["input_ids"].tolist()
    for seen in result["per_rank"]:  # TP=2: both ranks of the replica get every sample, sorted by id
        assert seen["ids"] == sorted(expected) and seen["adv_ids"] == seen["ids"]
        assert seen["tokens"] == [expected[i] for i in seen["ids"]]
        for g in range(2 * SAMPLES_PER_RANK // GROUP):  # advantages of a whole group sum to 0
            members = [k for k, i in enumerate(seen["ids"]) if i // GROUP == g or False]
            assert abs(sum(seen["adv"][k] for k in members)) < 1e-4 or not members
    assert result["node_layouts"]["advantage"] == result["node_layouts"]["generate"]  # "all" stays put
