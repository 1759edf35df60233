"""The staging buffers of a weight sync: where each engine rank's slice of a bucket is assembled.

Every engine rank's host (the training rank on its node that stages for it) keeps two buffers in shared
memory (CUDA IPC memory on GPU), each the size of that rank's largest bucket, allocated once. Their handles
(a few hundred bytes) are exchanged once; after that every rank that writes into a buffer has it open
(shared_memory_transport), and the engine's owner hands SGLang views of them. Buckets alternate between
the two buffers (slot b % 2), so ranks fill bucket b+1 while the owner loads bucket b.
"""

import contextlib

import torch
import torch.multiprocessing as mp


class StagingBuffers:
    """The staging buffers this rank holds: (engine, engine rank, slot) -> 1-D tensor, its own (hosted) ones and
    the other hosts' it opened. Serialization goes through SGLang's MultiprocessingSerializer, the format its
    `LocalSerializedTensor` reads (imported lazily: SGLang is heavy and only needed once a sync runs)."""

    def __init__(self, plan, rank: int, dtype: torch.dtype, device: torch.device):
        self.plan, self.rank, self.dtype, self.device = plan, rank, dtype, device
        self.buffers: dict = {}

    def allocate(self, readers: dict) -> dict:
        """Allocates the two buffers of each engine rank this rank hosts (dropping any it held); returns
        {(engine, engine rank, slot): {reader rank: handle}} for the other ranks' open(). readers: (engine,
        engine rank) -> the ranks that will open its buffers. One handle per reader: each serialization holds
        one reference that exactly one opening gives back (torch's file_system sharing on CPU, its CUDA-IPC
        reference counter on GPU), so a handle nobody opens would keep the buffer's memory after release(), and
        one opened twice would free it under its second reader."""
        from sglang.srt.utils import MultiprocessingSerializer

        self.buffers, handles = {}, {}
        for e, ranks in enumerate(self.plan.engines):
            for rp in ranks:
                if rp.host == self.rank:
                    numel = max(
                        sum(t.numel for t in self.plan.bucket_targets(b, e, rp.rank))
                        for b in range(len(self.plan.buckets))
                    )
                    for slot in (0, 1):
                        buffer = self.buffers[(e, rp.rank, slot)] = shared_empty(
                            numel, self.dtype, self.device
                        )
                        handles[(e, rp.rank, slot)] = {
                            reader: MultiprocessingSerializer.serialize(buffer)
                            for reader in sorted(readers.get((e, rp.rank), ()))
                        }
        return handles

    def open(self, gathered: list, hostnames: list[str]) -> None:
        """Opens the buffers other hosts made handles for this rank. gathered: every rank's allocate() answer,
        by rank; hostnames: every rank's host name. A buffer on another node is an error: shared memory cannot
        reach it."""
        from sglang.srt.utils import MultiprocessingSerializer

        for rank, handles in enumerate(gathered):
            for (e, r, slot), by_reader in handles.items():
                if self.rank not in by_reader:
                    continue
                if hostnames[rank] != hostnames[self.rank]:
                    raise ValueError(
                        f"engine {e} rank {r} is staged on rank {rank} ({hostnames[rank]}), another node than "
                        f"rank {self.rank} ({hostnames[self.rank]}): shared memory cannot reach it; use "
                        "sync.transport=auto or process_group"
                    )
                self.buffers[(e, r, slot)] = MultiprocessingSerializer.deserialize(by_reader[self.rank])

    def release(self) -> None:
        """Drops every buffer, hosted and opened; allocate() and open() make them again. Collective in effect:
        a hosted buffer's memory is freed once every process that opened it has dropped it too (its readers
        here, the engine's schedulers after each load); on GPU ipc_collect frees the blocks torch kept for them
        by then, and empty_cache returns the memory to the device (for SGLang's KV cache, or training)."""
        self.buffers = {}
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()

    def target_view(self, b: int, e: int, r: int, offset: int, target) -> torch.Tensor:
        """Bucket b's tensor `target` (at `offset` in the bucket) in engine rank (e, r)'s buffer, in its shape."""
        return self.buffers[(e, r, b % 2)][offset : offset + target.numel].view(target.shape)

    def views(self, b: int, e: int, rp) -> list[torch.Tensor]:
        """Bucket b's tensors in engine rank rp's buffer, in bucket order."""
        views, offset = [], 0
        for name in self.plan.buckets[b]:
            target = rp.by_name[name]
            views.append(self.target_view(b, e, rp.rank, offset, target))
            offset += target.numel
        return views

    def zero_padding(self, b: int, fills) -> None:
        """Zeroes the rows no piece writes (a padded vocabulary's tail) in hosted buffers; fills: [(engine,
        engine rank, target, offset)]. Before any write of the bucket, so there is no race with writers."""
        for e, r, target, offset in fills:
            first, count = target.padding_rows
            self.target_view(b, e, r, offset, target)[first : first + count].zero_()

    def hosted_handles(self, b: int) -> dict:
        """(engine, engine rank) -> a handle per tensor of bucket b, for the engine ranks this rank hosts and
        does not own: their owner hands SGLang handles made where the memory lives, so the engine rank's
        scheduler (on this node) can open them even when the owner runs on another node."""
        from sglang.srt.utils import MultiprocessingSerializer

        if self.plan.shared:
            return {}
        out = {}
        for e, ranks in enumerate(self.plan.engines):
            for rp in ranks:
                if rp.host == self.rank and self.plan.owners[e] != self.rank:
                    out[(e, rp.rank)] = [MultiprocessingSerializer.serialize(v) for v in self.views(b, e, rp)]
        return out


def shared_empty(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised 1-D tensor other processes can open: shared memory on CPU, plain memory on GPU
    (CUDA tensors are shared through IPC handles)."""
    if device.type != "cpu":
        return torch.empty(numel, dtype=dtype, device=device)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(max(1, numel) * itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))


@contextlib.contextmanager
def file_system_sharing():
    """CPU tensors opened by processes that are not descendants of their creator (another trainer rank,
    the engine's schedulers) must be shared by file name, not by file descriptor."""
    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        mp.set_sharing_strategy(previous)
