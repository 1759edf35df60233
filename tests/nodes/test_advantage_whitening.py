"""Advantage whitening spans the whole step's batch: split over two ranks, the nodes give what one
process gives on all of it (GAE over the data-parallel group, REINFORCE++-baseline over the rollout ranks)."""

from pathlib import Path

import pytest

from distflow.testing.launch import torchrun

JOB = Path(__file__).parent / "jobs" / "whiten_job.py"


@pytest.mark.slow
def test_whitening_over_two_ranks_equals_one_process():
    out = torchrun(JOB, nproc=2, timeout_s=240)
    assert "WHITEN OK" in out, out[-2000:]
