"""DAPO's dynamic sampling (distflow.nodes.dynamic_sampling): the pure pieces, then the collective decision under
torchrun with uneven kept counts per rank (4 gloo ranks, one of them holding no samples)."""

import json
import time
from pathlib import Path

import pytest
import torch

from distflow.coordination.data import PackedBatch
from distflow.nodes.dynamic_sampling import (
    Round,
    _keep_informative,
    _RoundIds,
    dp_unit,
    groups_to_train,
    share_out,
)
from distflow.testing.launch import JobFailed, torchrun

JOB = Path(__file__).parent / "jobs" / "dynamic_sampling_job.py"


@pytest.mark.parametrize(
    "counts, total, quotas",
    [
        ([3, 9, 0], 10, [3, 7, 0]),  # the low rank gives all it has, the rest comes from the rich one
        ([5, 5, 5], 7, [3, 2, 2]),  # even counts: remainder to the lower ranks
        ([2, 4, 0], 4, [2, 2, 0]),
        ([1, 1], 10, [1, 1]),  # fewer than asked: everything
        ([0, 0, 0], 4, [0, 0, 0]),
    ],
)
def test_share_out_is_as_even_as_the_counts_allow(counts, total, quotas):
    assert share_out(counts, total) == quotas


@pytest.mark.parametrize("n, dp, unit", [(8, 1, 1), (8, 2, 1), (2, 4, 2), (3, 4, 4), (4, 6, 3)])
def test_dp_unit_is_the_fewest_groups_that_split_over_dp(n, dp, unit):
    assert dp_unit(n, dp) == unit
    assert (unit * n) % dp == 0 and all((u * n) % dp for u in range(1, unit))


@pytest.mark.parametrize(
    "kept, target, unit, trained",
    [(12, 10, 1, 10), (10, 10, 2, 10), (6, 100, 4, 4), (3, 100, 4, 0), (0, 8, 1, 0)],
)
def test_groups_to_train(kept, target, unit, trained):
    assert groups_to_train(kept, target, unit) == trained


def _batch(ids, groups, scores):
    samples = PackedBatch.from_samples(
        ids,
        groups,
        {
            "input_ids": [torch.arange(3) for _ in ids],
            "response_mask": [torch.tensor([0.0, 1.0, 1.0]) for _ in ids],
        },
    )
    rewards = PackedBatch(
        samples.sample_ids, samples.groups, samples.lengths, {"rewards": torch.tensor(scores)}
    )
    return samples, rewards


def test_keep_informative_drops_whole_equal_groups():
    samples, rewards = _batch([0, 1, 2, 3, 4, 5], [7, 7, 8, 8, 9, 9], [0.0, 1.0, 0.5, 0.5, 1.0, 1.0])
    kept_s, kept_r, n_kept, n_dropped = _keep_informative(
        Round(samples, rewards, rewards.fields["rewards"]), True
    )
    assert kept_s.sample_ids.tolist() == [0, 1] and kept_r.sample_ids.tolist() == [0, 1]
    assert (n_kept, n_dropped) == (1, 2)
    everything = _keep_informative(Round(samples, rewards, rewards.fields["rewards"]), False)
    assert everything[0].sample_ids.tolist() == [0, 1, 2, 3, 4, 5] and everything[2:] == (3, 0)


def test_later_rounds_get_ids_past_the_earlier_ones():
    stride = 1_000_000
    base = 2 * stride  # engine 2: the rollout worker numbers from engine * ID_STRIDE each call
    first, _ = _batch([base, base + 1, base + 2, base + 3], [base, base, base + 1, base + 1], [0, 1, 0, 1])
    ids = _RoundIds.after(first, engine_index=2)
    again_s, again_r = _batch(
        [base, base + 1, base + 2, base + 3], [base, base, base + 1, base + 1], [1, 0, 1, 1]
    )
    again_s = PackedBatch(
        again_s.sample_ids,
        again_s.groups,
        again_s.lengths,
        again_s.fields,
        again_s.row_counts,
        infos={base + i: f"info{i}" for i in range(4)},
    )
    s, r = ids.shift(again_s, again_r)
    assert s.sample_ids.tolist() == [base + 4, base + 5, base + 6, base + 7] == r.sample_ids.tolist()
    assert s.groups.tolist() == [base + 2, base + 2, base + 3, base + 3] == r.groups.tolist()
    assert s.infos == {base + 4: "info0", base + 5: "info1", base + 6: "info2", base + 7: "info3"}
    third = ids.shift(again_s, again_r)[0]
    assert third.sample_ids.min().item() == base + 8 and third.groups.min().item() == base + 4


def _run(tmp_path, scenario, nproc=4, extra=()):
    out = tmp_path / f"{scenario}.json"
    torchrun(JOB, nproc=nproc, args=["--scenario", scenario, "--out", out, *extra], timeout_s=180)
    return json.loads(out.read_text())


def _check_kept(ranks, expected_quotas, n=2):
    seen = set()
    for rank, quota in zip(ranks, expected_quotas):
        assert rank["holds"]
        ids, groups = rank["ids"], rank["groups"]
        assert rank["reward_ids"] == ids and len(set(ids)) == len(ids)
        assert not seen & set(ids), "a sample is kept on two ranks"
        seen |= set(ids)
        by_group = {}
        for i, g in zip(ids, groups):
            by_group.setdefault(g, []).append(i)
        assert len(by_group) == quota
        for g, members in by_group.items():  # whole groups of informative prompts, rewards beside their ids
            assert sorted(members) == [g * 10 + k for k in range(n)]
        assert rank["rewards"] == [2.0 * (i % 10) for i in ids]
        assert rank["tokens"] == [[(g % 1000)] * (3 + i % 10) for i, g in zip(ids, groups)]


@pytest.mark.slow
def test_ranks_refill_together_and_trim_to_the_batch(tmp_path):
    ranks = _run(tmp_path, "trim")
    # 4 informative groups per round over the job (1 + 3 + 0): 4, 8, 12 >= 10 -> three rounds everywhere,
    # the non-holder included; 12 kept, trimmed to 10 as [3, 7, 0].
    for r in ranks:
        assert r["draws"] == [2, 3] and r["attempts"] == 3
        assert (r["kept_groups"], r["kept_before_trim"], r["dropped"], r["generated"]) == (10, 12, 24, 36)
        assert not r["partial"]
    _check_kept(ranks[:3], [3, 7, 0])
    assert not ranks[3]["holds"]
    # rank 1 keeps its earliest groups: all of rounds 1 and 2, one of round 3
    assert sorted({g // 1000 % 1000 for g in ranks[1]["groups"]}) == [1, 2, 3]
    assert sum(g // 1000 % 1000 == 3 for g in set(ranks[1]["groups"])) == 1
    assert all(g % 1000 < k for r, k in zip(ranks[:3], [1, 3, 0]) for g in r["groups"])


@pytest.mark.slow
def test_rounds_lost_with_their_engine_are_drawn_again_after_every_rank_resyncs(tmp_path):
    # Rank 1's rounds 1 and 3 come back lost once (its engine died under them): the all_reduce carries the
    # loss, every rank resyncs, rank 1 draws the round again and the others add nothing; the redraw is not
    # an attempt. What is kept is exactly the trim scenario's.
    ranks = _run(tmp_path, "trim", extra=["--lose-rank", 1, "--lose-attempts", "1,3"])
    for r in ranks:
        assert r["draws"] == [2, 3] and r["attempts"] == 3, r
        assert r["resyncs"] == [1, 3], r  # after round 1 (attempt 1) and after round 3
        assert r["redraws"] == [[1, r["rank"] == 1], [3, r["rank"] == 1]], r
        assert (r["kept_groups"], r["kept_before_trim"], r["dropped"], r["generated"]) == (10, 12, 24, 36)
    _check_kept(ranks[:3], [3, 7, 0])
    assert sorted({g // 1000 % 1000 for g in ranks[1]["groups"]}) == [1, 2, 3]


@pytest.mark.slow
def test_short_batch_after_the_last_round_is_partial_and_splits_over_dp(tmp_path):
    ranks = _run(tmp_path, "partial")
    # 3 informative groups per round, 2 rounds: 6, rounded down to a multiple of the DP unit 4.
    for r in ranks:
        assert r["draws"] == [2] and r["attempts"] == 2
        assert (r["kept_groups"], r["kept_before_trim"], r["partial"]) == (4, 6, True)
    _check_kept(ranks[:3], [2, 2, 0])


@pytest.mark.slow
def test_nothing_informative_gives_zero_groups_after_every_round(tmp_path):
    ranks = _run(tmp_path, "none")
    for r in ranks:
        assert r["draws"] == [2, 3] and r["attempts"] == 3 and r["kept_groups"] == 0
        assert r["dropped"] == 3 * 3 * 4
    assert all(r["ids"] == [] for r in ranks[:3])


@pytest.mark.slow
@pytest.mark.parametrize(
    "fail_rank", [0, 2]
)  # a rank holding samples; the rank that only joins the collective
def test_a_rank_failing_inside_the_sampling_loop_stops_every_rank_with_its_error(fail_rank):
    # It raises in its draw of round 2 while the other ranks wait in that round's all_reduce.
    start = time.perf_counter()
    with pytest.raises(JobFailed) as err:
        torchrun(
            JOB,
            nproc=3,
            args=["--scenario", "trim", "--fail-rank", fail_rank, "--fail-attempt", "2"],
            timeout_s=200,
        )
    elapsed = time.perf_counter() - start
    text = str(err.value)
    assert (
        f"rank {fail_rank} failed in node 'dynamic_sampling': ValueError: deliberate failure in round 2"
        in text
    )
    assert f"stopping: rank {fail_rank} failed" in text  # a waiting rank ended by the signal, with that error
    assert not any(f"rank {r} failed" in text for r in range(3) if r != fail_rank)
    assert elapsed < 120, elapsed  # far below the 300 s collective timeout the others would wait out
