"""torchrun job (4 ranks, gloo): moves real tensors with the DataCoordinator and checks each rank's view.

Prints, per rank: 'CASE-OK <case> rank=R' for every layout pair (bit equality with the expected view,
TP/CP peers holding the same samples), 'OVERLAP rank=R {...}' with the double buffer's recorded
timestamps, and 'TIMEOUT-OK rank=R <message>' for a peer that never sends.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from data_cases import FIELDS, expected_view, synthetic_batches  # noqa: E402

from distflow.coordination.data import (  # noqa: E402
    DataCoordinator,
    DataEdge,
    DataTransferTimeout,
    FieldPlacement,
    PlacedLayout,
    double_buffered,
)
from distflow.coordination.data import coordinator as data_coordinator  # noqa: E402
from distflow.layout import ParallelLayout, Placement  # noqa: E402

TIMEOUT_S = 60


def say(line: str) -> None:
    """One write() per line: lines from the 4 ranks share a pipe and must not interleave."""
    os.write(1, (line + "\n").encode())


def cases(world):
    colocated = Placement.create("colocated", world, 1)
    split = Placement.create("disaggregated", world, 1, num_rollout_ranks=2)
    rollout = PlacedLayout.rollout(colocated)

    def train(**kw):
        return PlacedLayout.training(ParallelLayout.for_world(world, **kw), colocated)

    yield "rollout_dp4_to_tp2_dp2", rollout, train(tp=2), True, ()
    yield "rollout_dp4_to_tp2_dp2_split_groups", rollout, train(tp=2), False, ()
    yield (
        "engine_tp2_to_pp2_dp2",
        PlacedLayout.rollout(Placement.create("colocated", world, 2)),
        train(pp=2),
        True,
        (),
    )
    yield "rollout_dp4_to_cp2_tp2_with_empty_holder", rollout, train(tp=2, cp=2), True, (1,)
    yield "megatron_tp2_dp2_to_tp1_pp2_dp2", train(tp=2), train(pp=2), True, ()
    yield (
        "disaggregated_rollout_to_train_tp2",
        PlacedLayout.rollout(split),
        PlacedLayout.training(ParallelLayout(tp=2), split),
        True,
        (),
    )


def check_case(coordinator, rank, name, producer, consumer, keep_groups, empty):
    batches = synthetic_batches(producer, num_groups=24, group_size=4, seed=len(name), empty_holders=empty)
    mine = batches.get(rank)
    if mine is None and producer.contains(rank):  # a non-holder's copy is ignored: give it junk
        mine = synthetic_batches(producer, 2, 2, seed=99)[producer.holders[0]]
    edge = DataEdge(name, producer, consumer, FIELDS, keep_groups=keep_groups)
    handle = coordinator.start(edge, mine)
    got = handle.wait(TIMEOUT_S)
    plan = handle.plan
    expected = expected_view(batches, plan, rank)
    assert (got is None) == (expected is None), f"{name} rank {rank}: got {got}, expected {expected}"
    if got is not None:
        assert got.equals(expected), f"{name} rank {rank}: batch differs from the expected view"
    assert handle.bytes_sent == plan.bytes_sent(rank) and handle.bytes_received == plan.bytes_received(rank)
    ids = [None] * dist.get_world_size()
    dist.all_gather_object(ids, None if got is None else got.sample_ids.tolist())
    c = consumer.coords(rank)
    if c is not None:  # every TP/CP/PP peer of my DP group has the same samples
        for peer in consumer.dp_ranks(c.dp):
            assert ids[peer] == ids[rank], f"{name}: rank {peer} has other samples than rank {rank}"
        every = sorted(i for d in range(consumer.layout.dp) for i in ids[consumer.dp_ranks(d)[0]])
        assert every == sorted(plan.table.sample_ids.tolist()), f"{name}: samples lost or duplicated"
    say(
        f"CASE-OK {name} rank={rank} samples={0 if got is None else len(got)} "
        f"sent={handle.bytes_sent} received={handle.bytes_received}"
    )


def overlap(coordinator, rank, world):
    """Three transfers through the double buffer; while computing on batch i, transfer i+1 runs. The
    compute loop runs until transfer i+1 reports done; timestamps show where each transfer finished."""
    placement = Placement.create("colocated", world, 1)
    producer = PlacedLayout.rollout(placement)
    consumer = PlacedLayout.training(ParallelLayout.for_world(world, tp=2), placement)
    fields = FieldPlacement({"input_ids": "all", "old_logprobs": "all"})
    handles, spans = [], []

    def starter(i):
        def start():
            batches = synthetic_batches(producer, 64, 8, seed=100 + i, max_len=4096)
            mine = batches.get(rank)
            mine = (
                None if mine is None else mine.select(torch.arange(len(mine)), ["input_ids", "old_logprobs"])
            )
            handles.append(coordinator.start(DataEdge(f"step{i}", producer, consumer, fields), mine))
            return handles[-1]

        return start

    a = torch.randn(256, 256)
    for i, batch in enumerate(double_buffered([starter(i) for i in range(3)], TIMEOUT_S)):
        begin, iterations = time.monotonic(), 0
        while iterations == 0 or (i < 2 and not handles[i + 1].done() and time.monotonic() - begin < 120):
            a = torch.tanh(a @ a)  # the "compute" on this batch
            iterations += 1
        spans.append(
            {
                "compute_start": begin,
                "compute_end": time.monotonic(),
                "iterations": iterations,
                "samples": len(batch),
            }
        )
    record = {"spans": spans, "transfers": [h.timeline for h in handles]}
    say(f"OVERLAP rank={rank} {json.dumps(record)}")


def timeout(rank, world):
    """Rank 1 drops its P2P ops with rank 0: rank 0's wait names the node, itself and the silent peer."""
    coordinator = DataCoordinator(timeout_s=3)
    placement = Placement.create("colocated", world, 1)
    producer = PlacedLayout.rollout(placement)
    consumer = PlacedLayout.training(ParallelLayout.for_world(world, tp=world), placement)
    batches = synthetic_batches(producer, 8, 2, seed=3)
    if rank == 1:
        post = data_coordinator.dist.batch_isend_irecv
        data_coordinator.dist.batch_isend_irecv = lambda ops: (
            post([op for op in ops if op.peer != 0]) if any(op.peer != 0 for op in ops) else []
        )
    handle = coordinator.start(DataEdge("train_actor", producer, consumer, FIELDS), batches.get(rank))
    if rank == 0:
        try:
            handle.wait(1.0)
            raise AssertionError("rank 0 got its data although rank 1 never sent")
        except DataTransferTimeout as error:
            early = str(error)
        try:
            handle.wait(30)
            raise AssertionError("the transfer finished although rank 1 never sent")
        except DataTransferTimeout as error:
            say(f"TIMEOUT-OK rank=0 {early} || {error}")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # A small metadata slot: the first transfer needs the second all-gather round, later ones fit.
    coordinator = DataCoordinator(timeout_s=TIMEOUT_S, metadata_slot_bytes=512)
    for name, producer, consumer, keep_groups, empty in cases(world):
        check_case(coordinator, rank, name, producer, consumer, keep_groups, empty)
    gather = coordinator._gather
    assert 1 <= gather.second_rounds < gather.gathers, (gather.second_rounds, gather.gathers)
    overlap(coordinator, rank, world)
    dist.barrier()
    timeout(rank, world)
    time.sleep(4)  # let the other ranks' 3 s waits run out before exiting
    sys.stdout.flush()
    os._exit(0)  # the timed-out transfer leaves P2P ops behind; do not tear the group down through them


if __name__ == "__main__":
    main()
