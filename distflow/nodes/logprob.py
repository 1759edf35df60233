"""actor_logprobs / ref_logprobs: Megatron forward passes in the training layout."""
from distflow.nodes.context import to_padded


def _logprobs(worker, samples):
    batch = to_padded(samples)
    logprobs, _entropy = worker.compute_logprobs(batch)
    return batch, logprobs


def actor_logprobs(ctx, inputs):
    batch, logprobs = _logprobs(ctx.actor, inputs["samples"])
    mask = batch["response_mask"]
    # Recomputed vs the engine's log-probs on the same weights: 0 up to numerics (1e-3 is the step-1 bound).
    diff = ((logprobs - batch["rollout_logprobs"]).abs() * mask).sum() / mask.sum().clamp(min=1)
    ctx.record(**{"rollout/logprob_diff_vs_actor": diff.item()})
    return {"old_logprobs": logprobs}


def ref_logprobs(ctx, inputs):
    return {"ref_logprobs": _logprobs(ctx.ref, inputs["samples"])[1]}
