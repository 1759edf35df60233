"""Megatron's process groups, built from a ParallelLayout, agree with the layout's pure rank maps."""
from pathlib import Path

import pytest

from distflow.testing.launch import torchrun

JOB = Path(__file__).parent / "jobs" / "check_megatron_groups.py"


@pytest.mark.slow
def test_tp2_pp2_groups_match_layout():
    out = torchrun(JOB, nproc=4, args=["--tp", "2", "--pp", "2"], timeout_s=600)
    assert sum(line.startswith("GROUPS-OK") for line in out.splitlines()) == 4, out
