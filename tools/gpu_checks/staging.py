"""The weight sync's staging check: DistFlow's WeightResharder pushes the 1B actor's shards into a second
process on the same GPU through CUDA-IPC staging buffers (shared memory in the CPU smoke run).

1. A sync with sync.verify: the second process (scheduler_process, in SGLang's scheduler's place) opens every
   bucket's buffers, loads them with engine_side.load_counted, and reports the checksum of every parameter
   (engine_side.probe); the resharder compares them with the shares the sender computed from its Megatron
   shards (verification.EngineVerifier): the bytes checked against the source shards.
2. Staging memory released (WeightResharder.release_staging) and restored (the next sync, verified again),
   with CUDA memory readings at each point.
3. GB/s: a warm sync without verification (the median of `repeats`), the second process's own open and copy
   times, against one device-to-device copy of the same bytes.
"""

import torch
from gpu_checks.context import memory_reading, synchronize, timed
from gpu_checks.scheduler_process import SchedulerProcessEngine

from distflow.coordination.weights import WeightResharder, engine_side, megatron_tensors, plan_weight_sync


def check_staging(ctx) -> dict:
    actor = ctx.state.get("actor")
    if actor is None:
        raise RuntimeError("no actor: the training check of the first size failed or was skipped")
    device = ctx.torch_device
    local = megatron_tensors(actor.chunks, actor.config)
    dtype = next(iter(local.values())).dtype  # the engine's dtype: bf16 on GPU (Float16Module), fp32 on CPU
    plan = plan_weight_sync(
        actor.spec,
        actor.checkpoint.config,
        actor.layout,
        ctx.placement,
        bucket_bytes=int(ctx.bucket_mb * 2**20),
        element_size=dtype.itemsize,
        mode="shards",
        padded_vocab=actor.chunks[0].vocab_size,
        engine_device=ctx.device,
    )
    out = {
        "transport": "CUDA IPC" if device.type == "cuda" else "CPU shared memory (CUDA IPC needs CUDA)",
        "bytes": plan.total_bytes,
        "buckets": len(plan.buckets),
        "bucket_mb": ctx.bucket_mb,
    }
    engine = SchedulerProcessEngine(plan.engines[0][0].param_shapes, dtype, device, ctx.timeout_s)
    try:
        from sglang.srt.utils import MultiprocessingSerializer

        out["serializer"] = MultiprocessingSerializer.__module__
        memory = {"before": memory_reading(device)}
        checked = WeightResharder(
            plan, local, engine=engine, engine_dtype=dtype, verify=True, load_format=engine_side.LOAD_COUNTED
        )
        out["verified_sync_s"] = checked.sync().seconds
        out["verified"] = True  # sync() raises WeightVerifyError on any parameter that differs
        out["received_bytes"] = sum(s["bytes"] for s in engine.load_stats)
        memory["staged"] = memory_reading(device)
        checked.release_staging()
        memory["released"] = memory_reading(device)
        checked.sync()  # allocates the buffers again, reopens them in the second process, verifies again
        out["verified_after_restore"] = True
        memory["restored"] = memory_reading(device)
        checked.release_staging()
        del checked
        out["staging_memory"] = memory

        fast = WeightResharder(
            plan, local, engine=engine, engine_dtype=dtype, load_format=engine_side.LOAD_COUNTED
        )
        fast.sync()  # warm: buffers allocated and opened
        engine.load_stats.clear()
        seconds, _ = timed(fast.sync, ctx.repeats, device)
        out["sync_s"] = seconds
        out["sync_gbps"] = plan.total_bytes / seconds / 1e9
        loads = engine.load_stats[-len(plan.buckets) :]  # the last sync's loads
        out["second_process_open_s"] = sum(s["open_s"] for s in loads)
        out["second_process_copy_gbps"] = (
            sum(s["bytes"] for s in loads) / sum(s["copy_s"] for s in loads) / 1e9
        )
        fast.release_staging()
    finally:
        engine.shutdown()
    out["device_copy_gbps"] = _copy_gbps(plan.total_bytes, dtype, device, ctx.repeats)
    out["sync_vs_device_copy"] = out["sync_gbps"] / out["device_copy_gbps"]
    return out


def _copy_gbps(nbytes: int, dtype: torch.dtype, device: torch.device, repeats: int) -> float:
    """GB/s of one copy of nbytes within the device (device-to-device on GPU, memcpy on CPU)."""
    src = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device=device).fill_(1)
    dst = torch.empty_like(src)
    synchronize(device)
    seconds, _ = timed(lambda: dst.copy_(src), max(repeats, 3), device)
    return nbytes / seconds / 1e9
