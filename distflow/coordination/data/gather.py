"""All-gathers the small per-sample metadata of a node's batch: every rank ends with the same SampleTable.

A payload is a JSON header (the rank's field schema) and an int64 matrix [samples, 3 + ragged fields] of
(sample id, group, length, rows per ragged field): about 8 * (3 + fields) bytes a sample, never the
samples' data. It travels in one all-gather of fixed-size slots (the slot starts with the payload's
size); only a payload larger than the slot needs a second all-gather for the rest. After each gather the
slot is resized to the largest payload plus a quarter, identically on every rank (all saw the same
sizes), so a steady stream of similar batches costs one collective per transfer.
"""

import datetime
import json
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from distflow.batch.packed import FieldSchema, PackedBatch
from distflow.coordination.data.plan import SampleTable


def encode_metadata(batch: Optional[PackedBatch]) -> bytes:
    if batch is None:
        header = {"schema": None, "ragged": []}
        matrix = np.zeros((0, 3), dtype=np.int64)
    else:
        ragged = sorted(batch.row_counts)
        header = {"schema": {n: s.encode() for n, s in batch.schema().items()}, "ragged": ragged}
        columns = [batch.sample_ids, batch.groups, batch.lengths] + [batch.row_counts[n] for n in ragged]
        matrix = torch.stack([c.cpu() for c in columns], 1).numpy().astype(np.int64, copy=False)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return np.int64(len(text)).tobytes() + text + np.ascontiguousarray(matrix).tobytes()


def decode_metadata(payload: bytes) -> tuple[Optional[dict[str, FieldSchema]], list[str], np.ndarray]:
    size = int(np.frombuffer(payload[:8], dtype=np.int64)[0])
    header = json.loads(payload[8 : 8 + size])
    columns = 3 + len(header["ragged"])
    matrix = np.frombuffer(payload[8 + size :], dtype=np.int64).reshape(-1, columns)
    schema = (
        None if header["schema"] is None else {n: FieldSchema.decode(s) for n, s in header["schema"].items()}
    )
    return schema, header["ragged"], matrix


def table_from_payloads(payloads: dict[int, bytes]) -> SampleTable:
    decoded = {rank: decode_metadata(p) for rank, p in payloads.items()}
    ragged = sorted({n for _, names, _ in decoded.values() for n in names})
    parts = {rank: m for rank, (_, _, m) in decoded.items()}

    def cat(xs):
        return np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, dtype=np.int64)

    rows = {
        n: cat(
            [
                m[:, 3 + names.index(n)] if n in names else np.full(len(m), -1)
                for _, names, m in decoded.values()
            ]
        )
        for n in ragged
    }
    return SampleTable(
        cat([m[:, 0] for m in parts.values()]),
        cat([m[:, 1] for m in parts.values()]),
        cat([m[:, 2] for m in parts.values()]),
        cat([np.full(len(m), rank) for rank, m in parts.items()]),
        rows,
        {rank: s for rank, (s, _, _) in decoded.items() if s is not None},
    )


class SlotGather:
    """all-gathers variable-size byte strings: one collective when each fits a slot, two otherwise."""

    def __init__(self, slot_bytes: int = 64 * 1024):
        self.slot_bytes = slot_bytes
        self.gathers = self.second_rounds = 0  # counters, for tests and tuning

    def __call__(self, payload: bytes, group, timeout_s: float, device) -> dict[int, bytes]:
        """{global rank: its payload} on every rank of `group`. Each wait is bounded by timeout_s."""
        timeout = datetime.timedelta(seconds=timeout_s)
        world = dist.get_world_size(group)
        slot = self.slot_bytes
        head = np.int64(len(payload)).tobytes() + payload[: slot - 8]
        firsts = _all_gather_padded(head, slot, world, group, timeout, device)
        sizes = [int(np.frombuffer(f[:8], dtype=np.int64)[0]) for f in firsts]
        parts = [f[8 : 8 + n] for f, n in zip(firsts, sizes)]
        longest = max(sizes)
        self.gathers += 1
        if longest > slot - 8:
            self.second_rounds += 1
            rests = _all_gather_padded(
                payload[slot - 8 :], longest - (slot - 8), world, group, timeout, device
            )
            parts = [p + r[: max(n - (slot - 8), 0)] for p, r, n in zip(parts, rests, sizes)]
        self.slot_bytes = max(1024, 1 << (longest * 5 // 4 + 8).bit_length())
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
        return dict(zip(ranks, parts))


def _all_gather_padded(data: bytes, size: int, world: int, group, timeout, device) -> list[bytes]:
    mine = torch.zeros(size, dtype=torch.uint8)
    if data:
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffers = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(buffers, mine.to(device), group=group, async_op=True).wait(timeout)
    return [b.cpu().numpy().tobytes() for b in buffers]


def gather_sample_table(
    batch: Optional[PackedBatch], group, timeout_s: float, device="cpu", gather: Optional[SlotGather] = None
) -> SampleTable:
    """Collective: every rank passes its batch (None where it holds nothing) and gets the whole table."""
    gather = gather or SlotGather()
    return table_from_payloads(gather(encode_metadata(batch), group, timeout_s, device))
