"""actor_logprobs / ref_logprobs: Megatron forward passes in the training layout."""

import torch

from distflow.algorithms.aggregation import masked_mean
from distflow.batch import to_padded


def _logprobs(worker, samples):
    batch = to_padded(samples)
    logprobs, entropy = worker.compute_logprobs(batch)
    return batch, logprobs, entropy


def actor_logprobs(ctx, inputs):
    batch, logprobs, entropy = _logprobs(ctx.workers.actor, inputs["samples"])
    ctx.record(
        **{
            k: v.item()
            for k, v in engine_gap_metrics(
                logprobs, entropy, batch["rollout_logprobs"], batch["response_mask"]
            ).items()
        }
    )
    return {"old_logprobs": logprobs}


def engine_gap_metrics(
    logprobs: torch.Tensor, entropy: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The actor's log-probs against the engine's, token means over `mask` (detached 0-d tensors): 0 up to
    numerics when both hold the same weights (1e-3 is the step-1 bound). At temperature 1 the sampled tokens'
    mean -log p estimates the policy's mean entropy on the same positions: a gap between the two means the
    engines do not sample from the policy being trained. Computed by the old-log-prob pass, or by the
    update's forward where that pass is skipped (nodes/train.py)."""
    logprobs, entropy = logprobs.detach(), entropy.detach()
    return {
        "rollout/logprob_diff_vs_actor": masked_mean((logprobs - rollout_logprobs).abs(), mask),
        "rollout/neg_logprob": masked_mean(-rollout_logprobs, mask),
        "rollout/actor_entropy": masked_mean(entropy, mask),
    }


def ref_logprobs(ctx, inputs):
    return {"ref_logprobs": _logprobs(ctx.workers.ref, inputs["samples"])[1]}
