"""The weight sync in numbers: bytes each training rank sends, bytes each engine rank receives, buckets, and
the lower-bound time at a given per-GPU link bandwidth.

Model: every engine needs one full bf16 copy of the HF weights (unpadded vocabulary), each engine GPU only
its own slice (K/V rows replicated where engine_tp exceeds the KV heads). A training rank holds one shard
(its TP/PP slice of the dense weights, its EP/ETP slice of the experts); the ranks that hold the same shard
(dense: the DP x CP replicas; experts: the expert-DP replicas) split the engines among themselves, so
the busiest sender sends its shard ceil(engines / replicas) times. The lower bound is the busier side
divided by the link: max(send, receive) / bandwidth; it ignores latency and the colocated ranks' own slice
(a local copy), so a real sync is slower, never faster.
"""

import math
from dataclasses import dataclass

from distflow.layout import ParallelLayout
from distflow.plan.model_size import ModelArch, engine_params_per_gpu, megatron_shard_params

SYNC_BYTES = 2  # bf16 weights on the wire


@dataclass(frozen=True)
class ReshardEstimate:
    model_bytes: float
    """One full copy of the weights (bf16, HF names and shapes)."""
    num_engines: int
    send_bytes: float
    """The busiest training rank's bytes per sync."""
    send_stage: int
    recv_bytes: float
    """Each engine rank's bytes per sync (its slice)."""
    bucket_bytes: int
    bandwidth_bytes_s: float

    @property
    def total_bytes(self) -> float:
        """Bytes that cross links per sync: one copy per engine."""
        return self.model_bytes * self.num_engines

    @property
    def sender_buckets(self) -> int:
        return math.ceil(self.send_bytes / self.bucket_bytes)

    @property
    def model_buckets(self) -> int:
        return math.ceil(self.model_bytes / self.bucket_bytes)

    @property
    def staging_bytes(self) -> float:
        """Each engine GPU's staging buffers during a sync: two buckets (one filled while the other loads),
        each no larger than the rank's whole slice."""
        return 2 * min(self.bucket_bytes, self.recv_bytes)

    @property
    def seconds_lower_bound(self) -> float:
        return max(self.send_bytes, self.recv_bytes) / self.bandwidth_bytes_s


def estimate_reshard(
    arch: ModelArch,
    actor: ParallelLayout,
    num_engines: int,
    engine_tp: int,
    bucket_mb: float,
    bandwidth_gbps: float,
) -> ReshardEstimate:
    """bandwidth_gbps: per-GPU link bandwidth in Gbit/s (e.g. 400 for one NDR InfiniBand NIC per GPU);
    bucket_mb: sync.bucket_mb, in MiB."""
    dense_replicas = actor.dp * actor.cp
    expert_replicas = actor.world_size // (actor.pp * actor.ep * actor.etp)
    send, stage_of_max = 0.0, 0
    for stage in range(actor.pp):
        shard = megatron_shard_params(
            arch, actor.tp, actor.pp, actor.ep, actor.etp, stage, vocab_padding=False
        )
        stage_send = SYNC_BYTES * (
            shard.dense * math.ceil(num_engines / dense_replicas)
            + shard.expert * math.ceil(num_engines / expert_replicas)
        )
        if stage_send > send:
            send, stage_of_max = stage_send, stage
    return ReshardEstimate(
        model_bytes=SYNC_BYTES * arch.total_params,
        num_engines=num_engines,
        send_bytes=send,
        send_stage=stage_of_max,
        recv_bytes=SYNC_BYTES * engine_params_per_gpu(arch, engine_tp),
        bucket_bytes=int(bucket_mb * 2**20),
        bandwidth_bytes_s=bandwidth_gbps * 1e9 / 8,
    )
