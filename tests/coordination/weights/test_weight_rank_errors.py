"""RankErrors (distflow/coordination/weights/rank_errors.py) in a 2-rank gloo job: a rank's failure skips its
own later phases, every rank enters the same exchanges (the same all_gather_object count on every rank), and
every rank raises one WeightSyncError naming the first failed rank with its error and the other failed ranks."""

from pathlib import Path

import pytest

from distflow.testing.launch import tagged_json, torchrun

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "rank_errors_job.py"
SUFFIX = "; an engine whose update began is stale until a sync succeeds"


@pytest.fixture(scope="module")
def results():
    out = torchrun(JOB, nproc=2, timeout_s=300)
    by_case = {}
    for r in tagged_json(out, "RANK-ERRORS"):
        by_case.setdefault(r["case"], {})[r["rank"]] = r
    assert all(sorted(ranks) == [0, 1] for ranks in by_case.values()), out[-3000:]
    return by_case


def test_without_failures_every_rank_gets_every_payload(results):
    for rank, r in results["none"].items():
        assert r["gathered"] == [[{"phase": 0, "rank": p}, {"phase": 1, "rank": p}] for p in (0, 1)]
        assert r["after"] == [{"phase": 2, "rank": p} for p in (0, 1)]
        assert r["ran"] == [0, 1, 2] and r["all_gathers"] == 2 and r["aborted"] == [] and "raised" not in r


def test_one_failed_rank_is_named_on_every_rank(results):
    text = "weight sync to version 7 failed on rank 1: ValueError: phase 0 broke on rank 1"
    case = results["rank1_phase0"]
    for r in case.values():
        assert r["raised"] == text + SUFFIX
        assert r["aborted"] == [text]  # on_failure sees the message without the suffix, before the raise
        assert r["all_gathers"] == 1  # the failed rank entered the exchange; nobody entered the next one
    assert case[1]["ran"] == [0]  # its second phase was skipped
    assert case[0]["ran"] == [0, 1]


def test_every_failed_rank_is_named(results):
    for case, first in [
        ("both_phase1", "ValueError: phase 1 broke on rank 0"),
        ("rank0_phase0_rank1_phase1", "ValueError: phase 0 broke on rank 0"),
    ]:
        for r in results[case].values():
            assert (
                r["raised"]
                == f"weight sync to version 7 failed on rank 0: {first} (and on ranks [1])" + SUFFIX
            )
            assert r["all_gathers"] == 1
    assert results["rank0_phase0_rank1_phase1"][0]["ran"] == [0]
    assert results["rank0_phase0_rank1_phase1"][1]["ran"] == [0, 1]
