"""The DataCoordinator over gloo with 4 processes: real tensors reach each rank bit-exactly for rollout ->
training, engine TP -> pipeline stages, CP, Megatron -> Megatron and disaggregated layouts; the double
buffer's next transfer completes while compute runs (from recorded timestamps); a silent peer is a timeout
that names node, rank and peer."""

import json
import re
from pathlib import Path

import pytest

from distflow.testing.launch import tagged_text, torchrun

JOB = Path(__file__).parent / "jobs" / "transfer_job.py"
CASES = [
    "rollout_dp4_to_tp2_dp2",
    "rollout_dp4_to_tp2_dp2_split_groups",
    "engine_tp2_to_pp2_dp2",
    "rollout_dp4_to_cp2_tp2_with_empty_holder",
    "megatron_tp2_dp2_to_tp1_pp2_dp2",
    "disaggregated_rollout_to_train_tp2",
]


@pytest.fixture(scope="module")
def job_output():
    return torchrun(JOB, nproc=4, timeout_s=300)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_rank_gets_its_exact_view(job_output, case):
    ok = {int(m) for m in re.findall(rf"^CASE-OK {case} rank=(\d+)", job_output, re.M)}
    assert ok == {0, 1, 2, 3}, job_output[-3000:]


@pytest.mark.slow
def test_double_buffer_overlaps_transfer_with_compute(job_output):
    records = [json.loads(m) for m in re.findall(r"^OVERLAP rank=\d+ (.*)$", job_output, re.M)]
    assert len(records) == 4, job_output[-3000:]
    for record in records:
        spans, transfers = record["spans"], record["transfers"]
        assert len(spans) == len(transfers) == 3
        for i in range(2):
            compute, nxt = spans[i], transfers[i + 1]
            # Transfer i+1 was started before compute on batch i began, was still moving data when it began,
            # and was complete (received and unpacked) before that compute ended: it ran under the compute.
            assert (
                nxt["started"]
                <= compute["compute_start"]
                < nxt["received"]
                <= nxt["done"]
                <= compute["compute_end"]
            )
            assert compute["iterations"] > 1


@pytest.mark.slow
def test_silent_peer_times_out_naming_node_rank_and_peer(job_output):
    line = next((t for t in tagged_text(job_output, "TIMEOUT-OK") if t.startswith("rank=0 ")), None)
    assert line is not None, job_output[-3000:]
    early, late = line.split(" || ")
    assert (
        "node 'train_actor': rank 0 waited 1.0 s for its data; the transfer is waiting to receive from rank 1"
        in early
    )
    assert "node 'train_actor': rank 0 timed out after 3 s waiting to receive from rank 1" in late
