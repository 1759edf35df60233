"""sync_weights: the trained actor's weights into the rollout engines (every rank, collective).

sync.method "auto" / "reshard": the layout-aware resharder (distflow.coordination.weights), built at the
first sync and kept for the run: every rank writes the slices of its own Megatron shards straight into the
staging buffers of the engine ranks that need them, each engine rank receiving only its own SGLang shards
(families with a shard layout: the dense ones and Mixtral / Qwen2-MoE / Qwen3-MoE; "auto" stages full HF-named
tensors the same way for the others and for models SGLang's CPU engine pads, sglang_layout.cpu_engine_pads).
sync.method "full": the simple fallback through Hugging Face-named full tensors: the actor is gathered on
rank 0, broadcast to every rank and loaded by each engine owner through SGLang's own loader.
Both record sync/seconds, sync/bytes (bytes loaded into all engines), sync/busiest_rank_bytes (bytes the
busiest rank sends) and sync/gbps, and leave every rank's RolloutWorker.weight_version at the new version.
"""
import time

import torch.distributed as dist

MODES = {"auto": "auto", "reshard": "shards"}  # sync.method -> the resharder's plan mode


def sync_weights(ctx, inputs):
    if ctx.cfg.sync.method == "full":
        metrics = _sync_full(ctx)
    else:
        metrics = _sync_resharded(ctx)
    ctx.record(**metrics)
    return {"weight_version": ctx.rollout.weight_version}


def _sync_resharded(ctx) -> dict:
    from distflow.coordination.weights import WeightResharder, megatron_tensors

    actor, rollout = ctx.actor, ctx.rollout
    resharder = getattr(rollout, "resharder", None)
    if resharder is None:
        common = dict(engine=rollout.engine, engine_dtype=ctx.cfg.model.dtype, mode=MODES[ctx.cfg.sync.method],
                      timeout_s=ctx.cfg.trainer.dist_timeout_s)
        if actor is not None:
            resharder = WeightResharder.for_megatron_worker(actor, ctx.cluster.placement, ctx.cfg.sync, **common)
        else:  # a rollout-only rank (disaggregated placement): it receives, and sends nothing
            from distflow.workers.rollout.worker import placement_device

            resharder = WeightResharder.for_rollout_rank(ctx.cfg.model.path, ctx.cluster.actor, ctx.cluster.placement,
                                                         ctx.cfg.sync, engine_device=placement_device(ctx.cfg),
                                                         **common)
        rollout.resharder = resharder
        resharder.version = rollout.weight_version  # a resumed run counts on from its checkpoint
        if ctx.rank == 0:
            print(resharder.plan.describe(), flush=True)
    rollout.make_resident(only=("weights",))  # the KV cache comes back at generation, after the staging
    # The parameters again: an optimizer may have replaced their storage since the last sync.
    stats = resharder.sync(megatron_tensors(actor.chunks, actor.config) if actor is not None else None)
    rollout.weights_synced(stats.version)
    return stats.metrics()


def _sync_full(ctx) -> dict:
    start = time.perf_counter()
    # Full tensors on global rank 0 (a training rank), None elsewhere.
    state = ctx.actor.export_hf_state() if ctx.actor is not None else None
    payload = [sorted(state.items()) if state is not None else None]
    dist.broadcast_object_list(payload, src=0)
    ctx.rollout.load_weights(payload[0])
    nbytes = sum(t.numel() * t.element_size() for _, t in payload[0])
    seconds = time.perf_counter() - start
    total = nbytes * ctx.cluster.placement.num_engines
    # Rank 0 holds the whole model and sends it to every other rank.
    busiest = nbytes * (dist.get_world_size() - 1)
    return {"sync/seconds": seconds, "sync/bytes": total, "sync/busiest_rank_bytes": busiest,
            "sync/gbps": total / max(seconds, 1e-9) / 1e9, "sync/version": ctx.rollout.weight_version}
