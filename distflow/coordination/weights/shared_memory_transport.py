"""The weight sync's transfer through shared memory: for engine ranks on the sender's own node.

A training rank writes each piece the plan gives it straight into the staging buffer of the engine rank
that needs it (shared memory on CPU, CUDA IPC memory on GPU; staging.py), at once: no funnel through one
rank, every stage and TP rank writes at the same time. Engine ranks a sender cannot reach this way go
through group_transport, which has the same interface:
    stage(b, items) -> checksum shares   this rank's pieces of bucket b, as soon as it has them
    delivers(b)                          whether deliver(b) has anything to move (the same on every rank)
    deliver(b) -> checksum shares        once every rank has staged bucket b (here: nothing left to do)
items: [(engine, engine rank, target, staging offset, piece, source view)]; shares: {(engine, engine rank,
parameter name): checksum share of what this rank wrote} when sync.verify is on, else {}.
"""

from distflow.coordination.weights import checksum as wsum
from distflow.coordination.weights.regions import narrow


class SharedMemoryTransport:
    """One per WeightResharder; writes into the buffers `staging` holds (its own and those it opened)."""

    def __init__(self, staging, verify: bool):
        self.staging, self.verify = staging, verify

    def stage(self, b: int, items) -> dict:
        """Copies each item's source into its place in the engine rank's staging buffer (call under no_grad)."""
        shares: dict = {}
        for e, r, target, offset, piece, src in items:
            dst = narrow(self.staging.target_view(b, e, r, offset, target), piece.dst)
            dst.copy_(src)
            if self.verify:
                key = (e, r, target.param_name)
                share = wsum.region_checksum(dst, target.param_shape, target.in_param(piece.dst))
                shares[key] = (shares.get(key, 0) + share) % wsum.MODULUS
        return shares

    def delivers(self, b: int) -> bool:
        return False

    def deliver(self, b: int) -> dict:
        return {}
