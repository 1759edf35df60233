"""The weight sync's transfer over a process group: for engine ranks a sender cannot write into directly.

Within a node a training rank writes its slices straight into the staging buffer of the engine rank that
needs them (shared memory on CPU, CUDA IPC on GPU; shared_memory_transport, whose interface this module
shares: stage, delivers, deliver). An engine on another node than a sender
(disaggregated placement across nodes) cannot be reached that way: the sender packs, per receiving host,
the pieces the plan gives it for that host into one flat buffer and sends it over a weight-update process
group (gloo on CPU, NCCL on GPU) made for the sync; the host unpacks it into its staging buffer. Both ends
know from the plan alone which pieces travel, in which order and of which size, so only tensor data moves.
sync.transport chooses: "shared_memory" (never the group), "process_group" (the group whenever sender and
host differ; also testable on one node) or "auto" (the group across nodes only).
Every wait is bounded by the group's timeout (trainer.dist_timeout_s).
"""

import datetime

import torch
import torch.distributed as dist

from distflow.coordination.weights import checksum as wsum
from distflow.coordination.weights.regions import narrow

MODES = ("auto", "shared_memory", "process_group")


class GroupTransport:
    """One per WeightResharder, on every rank of the job; set_hostnames is collective. Received pieces are
    written into the buffers `staging` (staging.StagingBuffers) holds for the engine ranks this rank hosts."""

    def __init__(self, plan, rank: int, mode: str, staging, verify: bool, timeout_s: float | None = None):
        if mode not in MODES:
            raise ValueError(f"sync.transport={mode!r}: one of {list(MODES)}")
        self.plan, self.rank, self.mode, self.timeout_s = plan, rank, mode, timeout_s
        self.staging, self.verify = staging, verify
        self.device, self.dtype = staging.device, staging.dtype
        self.group = None  # made by set_hostnames, only if some piece travels over it
        self.hostnames: list[str] | None = None
        self.receives = _index_receives(plan, rank)
        self._group_buckets: set[int] = set()
        self._outgoing: dict[
            int, list[torch.Tensor]
        ] = {}  # host -> this bucket's pieces for it, in plan order
        self.sent_bytes = 0

    def set_hostnames(self, hostnames: list[str]) -> None:
        """Every rank's host name (from the first sync's exchange); fixes which pairs use the group, and makes
        the group when any does. Collective: every rank calls it with the same names, so all decide alike."""
        self.hostnames = list(hostnames)
        self._group_buckets = {
            b
            for b in range(len(self.plan.buckets))
            if any(
                self.via_group(p.src_rank, rp.host)
                for rp, t in _bucket_targets(self.plan, b)
                for p in t.pieces
            )
        }
        if self._group_buckets and self.group is None:  # an NCCL group costs GPU memory: only when needed
            kwargs = {"timeout": datetime.timedelta(seconds=self.timeout_s)} if self.timeout_s else {}
            self.group = dist.new_group(backend="nccl" if self.device.type == "cuda" else "gloo", **kwargs)

    def via_group(self, sender: int, host: int) -> bool:
        """Whether `sender`'s pieces for engine ranks hosted by `host` travel over the group."""
        if sender == host or self.mode == "shared_memory":
            return False
        if self.mode == "process_group":
            return True
        return self.hostnames[sender] != self.hostnames[host]

    def stage(self, b: int, items) -> dict:
        """Packs this rank's pieces of bucket b for their hosts ([(engine, engine rank, target, staging offset,
        piece, source view)], in plan order); they travel at deliver(b). Writes nothing yet: no shares."""
        self._outgoing = {}
        for e, r, _, _, _, src in items:
            self._outgoing.setdefault(self.plan.engines[e][r].host, []).append(src)
        return {}

    def delivers(self, b: int) -> bool:
        """Whether bucket b moves anything over the group (the same answer on every rank)."""
        return b in self._group_buckets

    def deliver(self, b: int) -> dict:
        """Sends the pieces stage(b) packed, receives what other ranks send to the engine ranks this rank hosts
        and writes it into their staging buffers (slot b % 2). Returns the checksum shares of what it wrote (for
        sync.verify), keyed like shared_memory_transport's. Collective over the group: every rank calls it
        for each bucket where delivers(b)."""
        outgoing, self._outgoing = self._outgoing, {}
        dtype, works = self.dtype, []
        for host, parts in sorted(outgoing.items()):
            buffer = torch.cat([p.reshape(-1).to(dtype) for p in parts])
            works.append(dist.isend(buffer, host, group=self.group))
            self.sent_bytes += buffer.numel() * buffer.element_size()
        incoming = {}
        for sender, items in sorted(self.receives.get(b, {}).items()):
            if self.via_group(sender, self.rank):
                incoming[sender] = torch.empty(
                    sum(piece.numel for *_, piece in items), dtype=dtype, device=self.device
                )
                works.append(dist.irecv(incoming[sender], sender, group=self.group))
        for work in works:
            work.wait()
        shares: dict = {}
        with torch.no_grad():
            for sender, buffer in incoming.items():
                at = 0
                for e, r, target, offset, piece in self.receives[b][sender]:
                    dst = narrow(self.staging.target_view(b, e, r, offset, target), piece.dst)
                    dst.copy_(buffer[at : at + piece.numel].view(dst.shape))
                    at += piece.numel
                    if self.verify:
                        key = (e, r, target.param_name)
                        share = wsum.region_checksum(dst, target.param_shape, target.in_param(piece.dst))
                        shares[key] = (shares.get(key, 0) + share) % wsum.MODULUS
        return shares


def _bucket_targets(plan, b: int):
    for e in range(len(plan.engines)):
        for rp in plan.engines[e]:
            for target in plan.bucket_targets(b, e, rp.rank):
                yield rp, target


def _index_receives(plan, rank: int) -> dict:
    """bucket -> sender -> [(engine, engine rank, target, staging offset, piece)] that `rank` hosts, in the
    order the sender packs them (the resharder's write order)."""
    out: dict = {}
    for b in range(len(plan.buckets)):
        for e, ranks in enumerate(plan.engines):
            for rp in ranks:
                offset = 0
                for target in plan.bucket_targets(b, e, rp.rank):
                    if rp.host == rank:
                        for piece in target.pieces:
                            if piece.src_rank != rank:
                                out.setdefault(b, {}).setdefault(piece.src_rank, []).append(
                                    (e, rp.rank, target, offset, piece)
                                )
                    offset += target.numel
    return out
