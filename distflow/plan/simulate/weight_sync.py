"""Weight-sync time from the reshard plan (distflow/plan/reshard_estimate.py): the busiest sender's bytes
(or an engine GPU's, whichever is more) over the link, a message latency per bucket, the engine's copy of
its slice into its parameters, and the engine's own cost of an update: a fixed part and one per tensor
(measured by --calibrate on this machine's SGLang; 0 on a GPU profile, which has no such measurement)."""

from typing import Optional

from distflow.plan.model_size import ModelArch
from distflow.plan.reshard_estimate import ReshardEstimate
from distflow.plan.simulate.data_movement import Link


def hf_tensor_count(arch: ModelArch) -> int:
    """Tensors of the Hugging Face checkpoint (what the engine loads one by one)."""
    attention = 4 + (3 if arch.qkv_bias else 0) + (2 if arch.qk_norm else 0)
    if arch.num_experts:
        mlp = 1 + 3 * arch.num_experts + (4 if arch.shared_expert_ffn_hidden_size else 0)
    else:
        mlp = 3
    return arch.num_layers * (attention + mlp + 2) + 2 + (0 if arch.tie_embeddings else 1)


def weight_sync_seconds(
    reshard: ReshardEstimate,
    arch: ModelArch,
    link: Link,
    load_bandwidth: float,
    engine: dict,
    exchange_s: float = 0.0,
    engine_link: Optional[Link] = None,
) -> float:
    """link: how one training rank reaches an engine GPU; engine_link: how much an engine GPU takes in from
    all its senders at once (default: link; on a CPU host the senders write the engine's shared-memory
    staging buffer in parallel, one core each); load_bandwidth: the engine GPU's copy rate, unless
    --calibrate measured the engine's copy out of a freshly mapped staging buffer
    (engine["staging_copy_bandwidth"]); engine: the calibrated engine costs (profile.measured["engine"];
    {} for none); exchange_s: one exchange of every rank's status (RankErrors.exchange: an
    all_gather_object). The resharder exchanges after every bucket and at the end: buckets + 1 a sync,
    which on a host with more processes than cores cost far more than their bytes."""
    into_engine = engine_link or link
    transfer = (
        max(reshard.send_bytes / link.bandwidth, reshard.recv_bytes / into_engine.bandwidth)
        + reshard.sender_buckets * link.latency
    )
    return (
        (reshard.sender_buckets + 1) * exchange_s
        + transfer
        + reshard.recv_bytes / engine.get("staging_copy_bandwidth", load_bandwidth)
        + engine.get("engine_update_fixed_s", 0.0)
        + engine.get("engine_update_s_per_tensor", 0.0) * hf_tensor_count(arch)
    )
