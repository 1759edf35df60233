"""A batch that moves to its consumer layout in parts while its producer still produces it.

Every rank of the data coordinator's group takes part in every transfer, in the same order, so the parts
must be the same number on every rank whatever each producer's pace: a batch streams in `parts` parts, the
last of which moves with the whole batch (its hand-off), so `parts - 1` transfers run while it is produced.
A producing rank that expects n samples starts part i once it has produced (i + 1) * n // parts of them,
carrying all it produced since the previous part; a rank producing nothing starts every part
when it `close()`s (at once on the consumer ranks, after producing on the others). The consumer's DP rank of
every item is decided part by part (stream_placement.py); the hand-off's plan keeps those decisions
(DataEdge.placement), so each sample ends on the ranks that received it early.
"""

import threading
from dataclasses import replace
from typing import Iterator, Optional

from distflow.batch.packed import PackedBatch
from distflow.coordination.data.coordinator import DataCoordinator, DataEdge, TransferHandle
from distflow.coordination.data.stream_placement import StreamPlacement


class StreamedBatch:
    """One batch's early parts, on one rank. `edge` is the hand-off's edge (its placement is ignored)."""

    def __init__(self, coordinator: DataCoordinator, edge: DataEdge, parts: int):
        if parts < 2:
            raise ValueError(
                f"a streamed batch needs parts >= 2 (the last moves with the hand-off), got {parts}"
            )
        self.coordinator, self.parts = coordinator, parts
        self.placement = StreamPlacement(edge.consumer.layout.dp, edge.keep_groups)
        # The parts are uneven in size, so no equal rows per part; the hand-off's plan makes them equal.
        self.edge = replace(edge, equal_rows=False, placement=self.placement)
        self.handles: list[TransferHandle] = []
        self._expected: Optional[int] = None
        self._produced = 0
        self._pending: list[PackedBatch] = []
        self._lock = threading.Lock()

    def expect(self, samples: int) -> None:
        """This rank will produce `samples` samples through add(): sets the parts' thresholds."""
        with self._lock:
            self._expected = samples
            self._start_due()

    def add(self, batch: PackedBatch) -> None:
        """`batch` is produced: it leaves with the next part that falls due."""
        with self._lock:
            self._pending.append(batch)
            self._produced += len(batch)
            self._start_due()

    def close(self) -> None:
        """Starts every part not started yet, with what is pending (collective over the coordinator's group:
        every rank calls it once per batch, after its last add)."""
        with self._lock:
            while len(self.handles) < self.parts - 1:
                self._start_part()

    @property
    def closed(self) -> bool:
        """Every early part has started (the rest of the batch moves with the hand-off)."""
        return len(self.handles) == self.parts - 1

    def received(self, timeout_s: Optional[float] = None) -> Iterator[Optional[PackedBatch]]:
        """This rank's share of each early part in turn (None outside the consumer layout), each as soon as it
        has arrived, while the next ones move. Call after close()."""
        for handle in self.handles:
            yield handle.wait(timeout_s)

    def _start_due(self) -> None:
        if self._expected is None:
            return
        while len(self.handles) < self.parts - 1:
            due = (len(self.handles) + 1) * self._expected // self.parts
            if self._produced < due:
                return
            self._start_part()

    def _start_part(self) -> None:
        batch = PackedBatch.concat(self._pending) if self._pending else None
        self._pending = []
        self.handles.append(self.coordinator.start(self.edge, batch))
