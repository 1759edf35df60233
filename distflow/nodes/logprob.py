"""actor_logprobs / ref_logprobs: Megatron forward passes in the training layout."""

from distflow.batch import to_padded


def _logprobs(worker, samples):
    batch = to_padded(samples)
    logprobs, entropy = worker.compute_logprobs(batch)
    return batch, logprobs, entropy


def actor_logprobs(ctx, inputs):
    batch, logprobs, entropy = _logprobs(ctx.workers.actor, inputs["samples"])
    mask = batch["response_mask"]
    tokens = mask.sum().clamp(min=1)
    # Recomputed vs the engine's log-probs on the same weights: 0 up to numerics (1e-3 is the step-1 bound).
    diff = ((logprobs - batch["rollout_logprobs"]).abs() * mask).sum() / tokens
    # At temperature 1 the sampled tokens' mean -log p estimates the policy's mean entropy on the same
    # positions: a gap between the two means the engines do not sample from the policy being trained.
    ctx.record(
        **{
            "rollout/logprob_diff_vs_actor": diff.item(),
            "rollout/neg_logprob": (-(batch["rollout_logprobs"] * mask).sum() / tokens).item(),
            "rollout/actor_entropy": ((entropy * mask).sum() / tokens).item(),
        }
    )
    return {"old_logprobs": logprobs}


def ref_logprobs(ctx, inputs):
    return {"ref_logprobs": _logprobs(ctx.workers.ref, inputs["samples"])[1]}
