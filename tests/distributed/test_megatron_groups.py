"""Megatron's process groups, built from a ParallelLayout, agree with the layout's pure rank maps."""

import re
from pathlib import Path

import pytest

from distflow.testing.launch import torchrun

JOB = Path(__file__).parent / "jobs" / "check_megatron_groups.py"


@pytest.mark.slow
def test_tp2_pp2_groups_match_layout():
    out = torchrun(JOB, nproc=4, args=["--tp", "2", "--pp", "2"], timeout_s=600)
    # Ranks print concurrently, so two lines can share one; count the markers, not the lines.
    assert sorted(re.findall(r"GROUPS-OK rank=(\d+)", out)) == ["0", "1", "2", "3"], out
