"""A batch moving in parts (rollout.stream_chunks): each part's plan places its new samples and remembers
them; the hand-off's plan of the whole batch keeps every early decision and still gives a training layout's
DP ranks equal rows. Pure: no processes (the streamed job itself: tests/entry/test_stream_to_training.py)."""

import numpy as np
import pytest
import torch

from distflow.coordination.data import (
    DataEdge,
    FieldPlacement,
    PackedBatch,
    PlacedLayout,
    SampleTable,
    plan_redistribution,
)
from distflow.coordination.data.stream_placement import StreamPlacement
from distflow.coordination.data.streaming import StreamedBatch
from distflow.layout import ParallelLayout

FIELDS = FieldPlacement({"input_ids": "all"})


def packed_batch(ids, groups, lengths) -> PackedBatch:
    tokens = [torch.full((n,), i, dtype=torch.long) for i, n in zip(ids, lengths)]
    return PackedBatch.from_samples(ids, groups, {"input_ids": tokens})


def test_new_items_go_to_the_fewest_then_the_lightest_rank_and_stay():
    p = StreamPlacement(dp=2, keep_groups=False)
    # heaviest first: 9 -> rank 0; 5 -> rank 1 (fewest); 4 -> rank 1 (counts tie 1-1, rank 1 lighter: 5 < 9)
    assert p.assign([10, 11, 12], [5, 9, 4]).tolist() == [1, 0, 1]
    assert p.counts.tolist() == [1, 2] and p.tokens.tolist() == [9, 9]
    # placed items keep their rank; the new one goes to the rank with fewer items
    assert p.assign([12, 13, 10], [4, 1, 5]).tolist() == [1, 0, 1]
    assert p.equal_counts([10, 11, 12, 13]).tolist() == [1, 0, 1, 0]
    assert p.equal_counts([10, 11, 12]) is None  # unequal: the caller plans afresh
    assert p.equal_counts([10, 99]) is None  # 99 was never placed


def test_counts_never_differ_by_more_than_one_whatever_the_parts():
    rng = np.random.default_rng(0)
    for dp in (1, 2, 3, 4):
        p = StreamPlacement(dp=dp, keep_groups=True)
        keys = rng.permutation(1000)[: dp * 12]
        start = 0
        while start < len(keys):
            end = start + int(rng.integers(0, 7))
            p.assign(keys[start:end], rng.integers(1, 100, size=len(keys[start:end])))
            assert p.counts.max() - p.counts.min() <= 1
            start = end
        assert p.equal_counts(keys) is not None


def test_the_hand_off_keeps_the_ranks_the_parts_chose():
    """Rollout engine on rank 2 -> a training layout of dp=2 on ranks 0-1: two early parts, then the whole
    batch (the hand-off) with equal rows, every sample where its part sent it."""
    producer = PlacedLayout(ParallelLayout(dp=1), (2,))
    consumer = PlacedLayout(ParallelLayout(dp=2), (0, 1), replicated=True)
    placement = StreamPlacement(consumer.layout.dp, keep_groups=False)
    lengths = {i: 10 + 7 * (i % 3) for i in range(8)}

    def plan(ids, **kw):
        table = SampleTable.from_batches(
            {2: packed_batch(ids, groups=ids, lengths=[lengths[i] for i in ids])}
        )
        return plan_redistribution(producer, consumer, table, FIELDS, keep_groups=False, **kw)

    early = {}
    for part in ([0, 1, 2], [3]):  # 3 then 1 samples: neither splits 1:1
        p = plan(part, equal_rows=False, placement=placement)
        early.update({int(s): int(d) for s, d in zip(p.table.sample_ids, p.assignment)})
    final = plan(list(range(8)), placement=placement)
    got = dict(zip(final.table.sample_ids.tolist(), final.assignment.tolist()))
    assert all(got[s] == d for s, d in early.items())
    assert np.bincount(final.assignment, minlength=2).tolist() == [4, 4]
    # Without the placement the same batch is balanced afresh (the reference the parts approximate).
    fresh = plan(list(range(8)))
    assert np.bincount(fresh.assignment, minlength=2).tolist() == [4, 4]


def test_a_hand_off_the_parts_cannot_make_equal_is_planned_afresh():
    """A group placed early was dropped later (DAPO's filter): the placed ranks no longer split the batch
    equally, so the plan balances it as it would unstreamed (its log-probs are computed again)."""
    producer = PlacedLayout(ParallelLayout(dp=1), (2,))
    consumer = PlacedLayout(ParallelLayout(dp=2), (0, 1), replicated=True)
    placement = StreamPlacement(2, keep_groups=False)
    placement.assign([0, 1, 2, 3], [5, 5, 5, 5])  # 0, 2 -> one rank; 1, 3 -> the other
    table = SampleTable.from_batches({2: packed_batch([0, 2], groups=[0, 2], lengths=[5, 5])})
    with_placement = plan_redistribution(
        producer, consumer, table, FIELDS, keep_groups=False, placement=placement
    )
    without = plan_redistribution(producer, consumer, table, FIELDS, keep_groups=False)
    assert with_placement.assignment.tolist() == without.assignment.tolist()
    assert sorted(with_placement.assignment.tolist()) == [0, 1]


class _Recorder:
    """A DataCoordinator's start() as StreamedBatch calls it: records what each part carries."""

    def __init__(self):
        self.parts = []

    def start(self, edge, batch):
        self.parts.append(None if batch is None else batch.sample_ids.tolist())
        return len(self.parts)


def _edge():
    producer = PlacedLayout(ParallelLayout(dp=1), (1,))
    consumer = PlacedLayout(ParallelLayout(dp=1), (0,), replicated=True)
    return DataEdge("stream_samples", producer, consumer, FIELDS, keep_groups=False)


def _group(i):
    return packed_batch([i], groups=[i], lengths=[3])


def test_parts_start_as_the_producer_reaches_each_share_of_its_groups():
    coordinator = _Recorder()
    stream = StreamedBatch(coordinator, _edge(), parts=4)
    stream.expect(8)  # parts due after 2, 4 and 6 groups; the last quarter moves with the hand-off
    for i in range(8):
        stream.add(_group(i))
    assert coordinator.parts == [[0, 1], [2, 3], [4, 5]]
    assert stream.closed
    stream.close()  # nothing left to start: the hand-off carries groups 6 and 7 with the rest
    assert len(coordinator.parts) == 3
    assert stream.edge.placement is stream.placement and stream.edge.equal_rows is False


def test_a_rank_that_produces_nothing_starts_every_part_empty_at_close():
    coordinator = _Recorder()
    stream = StreamedBatch(coordinator, _edge(), parts=3)
    stream.close()
    assert coordinator.parts == [None, None]


def test_a_producer_with_fewer_groups_than_parts_starts_the_early_ones_at_once():
    coordinator = _Recorder()
    stream = StreamedBatch(coordinator, _edge(), parts=4)
    stream.expect(1)  # dues 0, 0, 0
    assert coordinator.parts == [None, None, None]
    stream.add(_group(0))  # goes with the hand-off


def test_one_part_is_not_a_stream():
    with pytest.raises(ValueError, match="parts >= 2"):
        StreamedBatch(_Recorder(), _edge(), parts=1)
