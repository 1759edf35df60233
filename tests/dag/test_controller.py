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
