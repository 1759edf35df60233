"""Executes a data plan over torch.distributed (gloo on CPU, NCCL on GPU), asynchronously.

Per (src, dst) pair each field travels as ONE contiguous message: the samples' unpadded token runs back
to back (their offsets follow from the all-gathered row counts), never a message per sample. When the
samples form one run in the sender's batch the message is a view of it (no pack copy), and when they
land as one run in the receiver's output it is received in place (no unpack copy); otherwise rows are
packed / scattered with a few large copies. Receivers preallocate from the plan. Each rank posts P2P ops
only to its actual peers, in one batch_isend_irecv, and copies the samples it keeps while they fly.

Everything (metadata all-gather, plan, transfer, unpack) runs on one background thread per
DataCoordinator, on a process group of its own, so it overlaps the caller's compute and never interleaves
with the training's collectives; transfers run in the order they were started, the same on every rank.
"""
import concurrent.futures
import datetime
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist

from distflow.batch.packed import PackedBatch, copy_runs
from distflow.coordination.data.gather import SlotGather, gather_sample_table
from distflow.coordination.data.layouts import FieldPlacement, PlacedLayout
from distflow.coordination.data.plan import RedistributionPlan, is_identity, plan_redistribution


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
            raise DataTransferTimeout(f"node {self.edge.node!r}: rank {self.rank} waited {timeout_s} s for its "
                                      f"data; the transfer is {self.state}") from None


class DataCoordinator:
    """The data plane of one rank. Construct it on every rank at the same point (it creates a process
    group when none is given, which is collective)."""

    def __init__(self, group=None, timeout_s: float = 300.0, metadata_slot_bytes: int = 64 * 1024):
        self.timeout_s = timeout_s
        self.group = group if group is not None else dist.new_group(timeout=datetime.timedelta(seconds=timeout_s))
        self.rank = dist.get_rank()
        backend = dist.get_backend(self.group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
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

    def _execute(self, edge: DataEdge, batch: Optional[PackedBatch], handle: TransferHandle) -> Optional[PackedBatch]:
        rank, t = self.rank, handle.timeline
        local = batch.sorted_by_id() if rank in edge.producer.holder_dp and batch is not None else None
        handle.state = "all-gathering sample metadata"
        table = gather_sample_table(local, self.group, self.timeout_s, self.device, self._gather)
        t["gathered"] = time.monotonic()
        plan = plan_redistribution(edge.producer, edge.consumer, table, edge.fields, keep_groups=edge.keep_groups,
                                   tolerance=edge.tolerance, node=edge.node)
        handle.plan = plan
        t["planned"] = time.monotonic()
        ops, peers = [], []
        for dst, _, tensor in outgoing(plan, rank, local, self.device):
            ops.append(dist.P2POp(dist.isend, _as_bytes(tensor), dst, self.group))
            peers.append(f"send to rank {dst}")
            handle.bytes_sent += tensor.numel() * tensor.element_size()
        receiver = Receiver(plan, rank, local, self.device)
        for src, _, tensor in receiver.targets:
            ops.append(dist.P2POp(dist.irecv, _as_bytes(tensor), src, self.group))
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
                raise DataTransferTimeout(f"node {edge.node!r}: rank {rank} timed out after {self.timeout_s} s "
                                          f"{handle.state} ({error})") from error
        t["received"] = time.monotonic()
        handle.state = "unpacking"
        out = receiver.finish()
        if self.device.type == "cuda":  # "done" means the data is there, not only that copies are queued
            torch.cuda.current_stream(self.device).synchronize()
        t["done"] = time.monotonic()
        handle.state = "done"
        return out


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view (gloo and NCCL move bytes; bool and bfloat16 need no special case)."""
    return tensor.reshape(-1).view(torch.uint8)


def _local_positions(plan: RedistributionPlan, local: Optional[PackedBatch]) -> Callable:
    """Maps plan positions of samples this rank holds to positions in its (sorted) local batch."""
    if local is None:
        return lambda positions: np.zeros(0, dtype=np.int64)
    ids = local.sample_ids.numpy()
    return lambda positions: np.searchsorted(ids, plan.table.sample_ids[positions])


def _runs_view(tensor: torch.Tensor, starts: np.ndarray, rows: np.ndarray) -> Optional[torch.Tensor]:
    """tensor[starts[0] : starts[0] + rows.sum()] when the runs are back to back, else None."""
    if not rows.size:
        return tensor[:0]
    if (starts[1:] == starts[:-1] + rows[:-1]).all():
        return tensor[int(starts[0]):int(starts[0] + rows.sum())]
    return None


def outgoing(plan: RedistributionPlan, rank: int, local: Optional[PackedBatch], device):
    """[(dst, field, tensor)] this rank sends, in the order the receivers expect (by dst, then field).
    A tensor is a view of the local batch when the samples are one run of it, else a packed copy."""
    to_local = _local_positions(plan, local)
    out = []
    for tr in plan.sends(rank):
        at = torch.from_numpy(to_local(tr.positions))
        for seg in tr.segments:
            if not seg.rows:
                continue
            src = local.fields[seg.field]
            rows = local.rows(seg.field)[at].numpy()
            starts = local.offsets(seg.field)[at].numpy()
            tensor = _runs_view(src, starts, rows)
            if tensor is None:
                tensor = torch.empty((seg.rows, *src.shape[1:]), dtype=src.dtype, device=src.device)
                copy_runs(tensor, np.cumsum(rows) - rows, src, starts, rows)
            out.append((tr.dst, seg.field, tensor.to(device)))
    return out


class Receiver:
    """This rank's consumer batch under construction: output tensors preallocated from the plan, receive
    targets (slices of them where the incoming samples land as one run), kept samples copied in."""

    def __init__(self, plan: RedistributionPlan, rank: int, local: Optional[PackedBatch], device):
        self.plan, self.local, self.device = plan, local, device
        self.consumer = plan.consumer.contains(rank)
        self.mine = plan.consumer_positions(rank)
        self.kept = plan.kept(rank)
        self.to_local = _local_positions(plan, local)
        self.names = [n for n in plan.consumer_fields(rank) if n in plan.schema]
        self.rows = {n: plan.field_rows(n, self.mine) for n in self.names}
        self.starts = {n: np.cumsum(r) - r for n, r in self.rows.items()}
        self.out, self.targets, self._scatter = {}, [], []
        if not self.consumer:
            return
        for name in self.names:
            schema = plan.schema[name]
            if self._can_reuse_local(name):
                self.out[name] = local.fields[name]
            else:
                self.out[name] = torch.empty((int(self.rows[name].sum()), *schema.inner_shape), dtype=schema.dtype,
                                             device=device)
        for tr in plan.receives(rank):
            where = np.searchsorted(self.mine, tr.positions)
            for seg in tr.segments:
                if not seg.rows:
                    continue
                dst_starts, rows = self.starts[seg.field][where], self.rows[seg.field][where]
                target = _runs_view(self.out[seg.field], dst_starts, rows)
                if target is None:  # lands scattered: receive into a buffer, place the rows after
                    schema = plan.schema[seg.field]
                    target = torch.empty((seg.rows, *schema.inner_shape), dtype=schema.dtype, device=device)
                    self._scatter.append((seg.field, dst_starts, target, np.cumsum(rows) - rows, rows))
                self.targets.append((tr.src, seg.field, target))

    def _can_reuse_local(self, name: str) -> bool:
        """Everything this rank consumes is its own whole local batch, in order: no copy at all."""
        return (self.local is not None and len(self.local) == len(self.mine) and
                np.array_equal(self.kept, self.mine) and
                np.array_equal(self.to_local(self.kept), np.arange(len(self.mine))))

    def copy_kept(self) -> None:
        if not self.consumer or not self.kept.size:
            return
        where = np.searchsorted(self.mine, self.kept)
        at = torch.from_numpy(self.to_local(self.kept))
        for name in self.names:
            if self.out[name] is self.local.fields[name]:
                continue
            copy_runs(self.out[name], self.starts[name][where], self.local.fields[name],
                      self.local.offsets(name)[at].numpy(), self.rows[name][where])

    def finish(self) -> Optional[PackedBatch]:
        if not self.consumer:
            return None
        for name, dst_starts, buf, src_starts, rows in self._scatter:
            copy_runs(self.out[name], dst_starts, buf, src_starts, rows)
        t = self.plan.table
        return PackedBatch(t.sample_ids[self.mine], t.groups[self.mine], t.lengths[self.mine], self.out,
                           {n: torch.from_numpy(self.rows[n].copy()) for n in self.names if self.plan.schema[n].ragged})


def double_buffered(starts: Iterable[Callable[[], TransferHandle]], timeout_s: float) -> Iterator[PackedBatch]:
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
