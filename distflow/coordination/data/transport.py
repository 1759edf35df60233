"""Moves a data plan's bytes over torch.distributed (gloo on CPU, NCCL on GPU): what each rank sends, and
the consumer batch it receives into.

Per (src, dst) pair each field travels as ONE contiguous message: the samples' unpadded token runs back
to back (their offsets follow from the all-gathered row counts), never a message per sample. When the
samples form one run in the sender's batch the message is a view of it (no pack copy), and when they
land as one run in the receiver's output it is received in place (no unpack copy); otherwise rows are
packed / scattered with a few large copies. Receivers preallocate from the plan. Each rank posts P2P ops
only to its actual peers, in one batch_isend_irecv (coordinator.py), and copies the samples it keeps while
they fly.
"""

from typing import Callable, Optional

import numpy as np
import torch

from distflow.batch.packed import PackedBatch, copy_runs
from distflow.coordination.data.plan import RedistributionPlan


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
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
        return tensor[int(starts[0]) : int(starts[0] + rows.sum())]
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
                self.out[name] = torch.empty(
                    (int(self.rows[name].sum()), *schema.inner_shape), dtype=schema.dtype, device=device
                )
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
        return (
            self.local is not None
            and len(self.local) == len(self.mine)
            and np.array_equal(self.kept, self.mine)
            and np.array_equal(self.to_local(self.kept), np.arange(len(self.mine)))
        )

    def copy_kept(self) -> None:
        if not self.consumer or not self.kept.size:
            return
        where = np.searchsorted(self.mine, self.kept)
        at = torch.from_numpy(self.to_local(self.kept))
        for name in self.names:
            if self.out[name] is self.local.fields[name]:
                continue
            copy_runs(
                self.out[name],
                self.starts[name][where],
                self.local.fields[name],
                self.local.offsets(name)[at].numpy(),
                self.rows[name][where],
            )

    def finish(self) -> Optional[PackedBatch]:
        if not self.consumer:
            return None
        for name, dst_starts, buf, src_starts, rows in self._scatter:
            copy_runs(self.out[name], dst_starts, buf, src_starts, rows)
        t = self.plan.table
        return PackedBatch(
            t.sample_ids[self.mine],
            t.groups[self.mine],
            t.lengths[self.mine],
            self.out,
            {n: torch.from_numpy(self.rows[n].copy()) for n in self.names if self.plan.schema[n].ragged},
        )
