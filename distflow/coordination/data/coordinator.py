"""The data plane of one rank: DataCoordinator moves a DAG edge's samples from the producer's layout to the
consumer's, asynchronously.

Everything (metadata all-gather, plan, transfer, unpack) runs on one background thread per
DataCoordinator, on a process group of its own, so it overlaps the caller's compute and never interleaves
with the training's collectives; transfers run in the order they were started, the same on every rank.
(The trainer's data mover, distflow/dag/data_mover.py, waits for each edge: `transfer`. A step's rollout
moves as the step starts, RankController.hand_off, before the engines generate ahead: rollout.max_staleness.)
The bytes move as transport.py says (one message per peer and field, posted in one batch_isend_irecv).
"""

import concurrent.futures
import datetime
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional

import torch
import torch.distributed as dist

from distflow.batch.packed import PackedBatch
from distflow.coordination.data.gather import SlotGather, gather_sample_table
from distflow.coordination.data.layouts import FieldPlacement, PlacedLayout
from distflow.coordination.data.plan import RedistributionPlan, is_identity, plan_redistribution
from distflow.coordination.data.stream_placement import StreamPlacement
from distflow.coordination.data.transport import Receiver, as_bytes, outgoing


class DataTransferTimeout(TimeoutError):
    """A wait ran out of time; the message names the node, this rank and what it was waiting for."""


@dataclass(frozen=True)
class DataEdge:
    """One DAG edge's data movement: node (the consumer's name, for messages), layouts and rules."""

    node: str
    producer: PlacedLayout
    consumer: PlacedLayout
    fields: FieldPlacement
    keep_groups: bool = True
    tolerance: float = 0.01
    equal_rows: Optional[bool] = None
    """Every consumer DP rank gets as many samples (default: for a training layout; plan_redistribution)."""
    placement: Optional[StreamPlacement] = field(default=None, compare=False)
    """A batch moving in parts: the DP ranks its earlier parts went to (stream_placement.py)."""


class TransferHandle:
    """An in-flight transfer. wait() returns this rank's consumer batch (sorted by sample id; None on a
    rank outside the consumer layout). timeline holds time.monotonic() stamps: started, gathered, planned,
    posted, received, done."""

    def __init__(self, edge: DataEdge, rank: int, timeout_s: float):
        self.edge, self.rank, self.timeout_s = edge, rank, timeout_s
        self.timeline: dict[str, float] = {"started": time.monotonic()}
        self.plan: Optional[RedistributionPlan] = None
        self.bytes_sent = self.bytes_received = 0
        self.state = "queued behind earlier transfers"
        self._future: concurrent.futures.Future = concurrent.futures.Future()

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout_s: Optional[float] = None) -> Optional[PackedBatch]:
        """The consumer batch; raises DataTransferTimeout after timeout_s (default: the coordinator's)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            return self._future.result(timeout=timeout_s)
        except TimeoutError:
            if self._future.done():  # the transfer itself failed (e.g. a peer timed out): its own error
                raise
            raise DataTransferTimeout(
                f"node {self.edge.node!r}: rank {self.rank} waited {timeout_s} s for its "
                f"data; the transfer is {self.state}"
            ) from None


class DataCoordinator:
    """The data plane of one rank. Construct it on every rank at the same point (it creates a process
    group when none is given, which is collective)."""

    def __init__(self, group=None, timeout_s: float = 300.0, metadata_slot_bytes: int = 64 * 1024):
        self.timeout_s = timeout_s
        self.group = (
            group if group is not None else dist.new_group(timeout=datetime.timedelta(seconds=timeout_s))
        )
        self.rank = dist.get_rank()
        backend = dist.get_backend(self.group)
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="distflow-data")
        self._gather = SlotGather(metadata_slot_bytes)  # used only by the worker thread

    def start(self, edge: DataEdge, batch: Optional[PackedBatch]) -> TransferHandle:
        """Starts moving `batch` (this rank's output of the producer node; read on holder ranks, and on
        every rank when nothing moves) to the consumer layout. Returns at once."""
        handle = TransferHandle(edge, self.rank, self.timeout_s)
        if is_identity(edge.producer, edge.consumer):
            handle.plan = plan_redistribution(edge.producer, edge.consumer, None, edge.fields, node=edge.node)
            handle.timeline.update(done=time.monotonic())
            handle.state = "done (same layout, nothing moves)"
            handle._future.set_result(None if batch is None else batch.sorted_by_id())
            return handle

        def run():
            try:
                if self.device.type == "cuda":  # the current device is per thread
                    torch.cuda.set_device(self.device)
                handle._future.set_result(self._execute(edge, batch, handle))
            except BaseException as error:  # delivered to whoever waits on the handle
                handle.state = f"failed: {error}"
                handle._future.set_exception(error)

        self._worker.submit(run)
        return handle

    def transfer(self, edge: DataEdge, batch: Optional[PackedBatch], timeout_s: Optional[float] = None):
        """start(...).wait(timeout_s): the synchronous form."""
        return self.start(edge, batch).wait(timeout_s)

    def close(self):
        self._worker.shutdown(wait=True)

    def _execute(
        self, edge: DataEdge, batch: Optional[PackedBatch], handle: TransferHandle
    ) -> Optional[PackedBatch]:
        rank, t = self.rank, handle.timeline
        local = batch.sorted_by_id() if rank in edge.producer.holder_dp and batch is not None else None
        handle.state = "all-gathering sample metadata"
        table = gather_sample_table(local, self.group, self.timeout_s, self.device, self._gather)
        t["gathered"] = time.monotonic()
        plan = plan_redistribution(
            edge.producer,
            edge.consumer,
            table,
            edge.fields,
            keep_groups=edge.keep_groups,
            tolerance=edge.tolerance,
            node=edge.node,
            equal_rows=edge.equal_rows,
            placement=edge.placement,
        )
        handle.plan = plan
        t["planned"] = time.monotonic()
        ops, peers = [], []
        for dst, _, tensor in outgoing(plan, rank, local, self.device):
            ops.append(dist.P2POp(dist.isend, as_bytes(tensor), dst, self.group))
            peers.append(f"send to rank {dst}")
            handle.bytes_sent += tensor.numel() * tensor.element_size()
        receiver = Receiver(plan, rank, local, self.device)
        for src, _, tensor in receiver.targets:
            ops.append(dist.P2POp(dist.irecv, as_bytes(tensor), src, self.group))
            peers.append(f"receive from rank {src}")
            handle.bytes_received += tensor.numel() * tensor.element_size()
        works = dist.batch_isend_irecv(ops) if ops else []
        t["posted"] = time.monotonic()
        receiver.copy_kept()  # while the messages fly
        deadline = time.monotonic() + self.timeout_s
        for i, work in enumerate(works):
            handle.state = f"waiting to {peers[i] if len(works) == len(ops) else 'exchange with peers'}"
            try:
                work.wait(datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except RuntimeError as error:
                raise DataTransferTimeout(
                    f"node {edge.node!r}: rank {rank} timed out after {self.timeout_s} s "
                    f"{handle.state} ({error})"
                ) from error
        t["received"] = time.monotonic()
        handle.state = "unpacking"
        out = receiver.finish()
        if self.device.type == "cuda":  # "done" means the data is there, not only that copies are queued
            torch.cuda.current_stream(self.device).synchronize()
        t["done"] = time.monotonic()
        handle.state = "done"
        return out


def double_buffered(
    starts: Iterable[Callable[[], TransferHandle]], timeout_s: float
) -> Iterator[PackedBatch]:
    """Yields each transfer's batch while the next transfer is already under way (two buffers live at once).

    starts: callables that start the transfers, in order (e.g. lambda: coordinator.start(edge, batch)).
    Compute on a yielded batch overlaps the next transfer; at most two transfers' data are held.
    """
    iterator = iter(starts)
    first = next(iterator, None)
    if first is None:
        return
    pending = first()
    for start in iterator:
        batch = pending.wait(timeout_s)
        pending = start()
        yield batch
    yield pending.wait(timeout_s)
