"""sync_weights: the trained actor's weights into the rollout engines.

This is the fallback path through Hugging Face-named full tensors (the engine's own loader): the actor
is gathered on rank 0 and handed to every engine owner. It is exact for any family, and right for small
models; the layout-aware resharder (distflow.coordination.weights) replaces it for large ones.
"""
import time

import torch.distributed as dist


def sync_weights(ctx, inputs):
    start = time.perf_counter()
    state = ctx.actor.export_hf_state()  # full tensors on global rank 0, None elsewhere
    payload = [sorted(state.items()) if state is not None else None]
    dist.broadcast_object_list(payload, src=0)
    ctx.rollout.load_weights(payload[0])
    nbytes = sum(t.numel() * t.element_size() for _, t in payload[0])
    seconds = time.perf_counter() - start
    ctx.record(**{"sync/seconds": seconds, "sync/bytes": nbytes, "sync/gbps": nbytes / max(seconds, 1e-9) / 1e9})
    return {"weight_version": ctx.rollout.weight_version}
