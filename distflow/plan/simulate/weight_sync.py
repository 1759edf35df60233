"""Weight-sync time from the reshard plan (distflow/plan/reshard_estimate.py): the busiest sender's bytes
(or an engine GPU's, whichever is more) over the link, a message latency per bucket, the engine's copy of
its slice into its parameters, and the engine's own cost of an update: a fixed part and one per tensor
(measured by --calibrate on this machine's SGLang; 0 on a GPU profile, which has no such measurement)."""

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
    allgather_s: float = 0.0,
) -> float:
    """link: how a training rank reaches an engine GPU; load_bandwidth: the engine GPU's copy rate;
    engine: the calibrated engine costs (profile.measured["engine"]; {} for none); allgather_s: one small
    all-gather over the job's ranks. The resharder agrees on every bucket and on the end with an
    exchange of every rank's status (RankErrors.exchange: all_gather_object, i.e. two all-gathers, one of
    sizes and one of bytes): 2 x (buckets + 1) all-gathers a sync, which on a host with more processes
    than cores cost far more than their bytes."""
    return (
        2 * (reshard.sender_buckets + 1) * allgather_s
        + link.seconds(max(reshard.send_bytes, reshard.recv_bytes), reshard.sender_buckets)
        + reshard.recv_bytes / load_bandwidth
        + engine.get("engine_update_fixed_s", 0.0)
        + engine.get("engine_update_s_per_tensor", 0.0) * hf_tensor_count(arch)
    )
