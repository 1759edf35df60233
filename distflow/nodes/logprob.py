"""actor_logprobs / ref_logprobs: Megatron forward passes in the training layout."""

import torch

from distflow.algorithms.aggregation import masked_mean
from distflow.algorithms.rollout_correction import mismatch_metrics
from distflow.batch import to_padded


def _logprobs(ctx, role: str, samples):
    """(padded batch, log-probs, entropy) of `role`'s model on this rank's samples; those a streamed step
    computed while the engines generated (dag/streaming.py: precompute) are taken as they are, the
    rest computed now."""
    samples = samples.sorted_by_id()
    batch = to_padded(samples)
    ready = ctx.step.streamed_logprobs.get(role, {})
    ids = samples.sample_ids.tolist()
    missing = [i for i, sample_id in enumerate(ids) if sample_id not in ready]
    if role in ctx.step.streamed_logprobs:  # a streamed step: how much of the pass the generation hid
        ctx.record(**{"perf/logprobs_streamed": 1.0 - len(missing) / max(len(ids), 1)})
    if len(missing) == len(ids):
        logprobs, entropy = getattr(ctx.workers, role).compute_logprobs(batch)
        return batch, logprobs, entropy
    logprobs = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
    entropy = torch.zeros_like(logprobs)
    rows = []
    if missing:  # every rank of the replica holds the same rows, so all of them take this branch alike
        computed = getattr(ctx.workers, role).compute_logprobs(to_padded(samples.select(missing)))
        rows = [(i, computed[0][j], computed[1][j]) for j, i in enumerate(missing)]
    rows += [(i, *ready[sample_id]) for i, sample_id in enumerate(ids) if sample_id in ready]
    lengths = samples.rows("input_ids").tolist()
    for i, lp, ent in rows:
        logprobs[i, : lengths[i]] = lp[: lengths[i]]
        entropy[i, : lengths[i]] = ent[: lengths[i]]
    return batch, logprobs, entropy


def precompute(ctx, role: str, part) -> None:
    """`role`'s log-probs of a part of the step's samples that reached this rank while the engines still
    generate (dag/streaming.py), kept in the step's state for its log-prob node."""
    if part is None or not len(part):
        return
    part = part.sorted_by_id()
    logprobs, entropy = getattr(ctx.workers, role).compute_logprobs(to_padded(part))
    ready = ctx.step.streamed_logprobs.setdefault(role, {})
    for i, (sample_id, length) in enumerate(zip(part.sample_ids.tolist(), part.rows("input_ids").tolist())):
        ready[sample_id] = (logprobs[i, :length].clone(), entropy[i, :length].clone())


def actor_logprobs(ctx, inputs):
    batch, logprobs, entropy = _logprobs(ctx, "actor", inputs["samples"])
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
    """The actor's log-probs against the engine's, over `mask` (detached 0-d tensors): the rollout_corr/*
    mismatch metrics (algorithms/rollout_correction.py: mismatch_metrics; the mean |diff| is 0 up to
    numerics when both hold the same weights, 1e-3 the step-1 bound). At temperature 1 the sampled tokens'
    mean -log p estimates the policy's mean entropy on the same positions: a gap between the two means the
    engines do not sample from the policy being trained. Computed by the old-log-prob pass, or by the
    update's forward where that pass is skipped (nodes/train.py)."""
    logprobs, entropy = logprobs.detach(), entropy.detach()
    gap = mismatch_metrics(logprobs, rollout_logprobs, mask)
    return {
        **{f"rollout_corr/{name}": value for name, value in gap.items()},
        "rollout/neg_logprob": masked_mean(-rollout_logprobs, mask),
        "rollout/actor_entropy": masked_mean(entropy, mask),
    }


def ref_logprobs(ctx, inputs):
    return {"ref_logprobs": _logprobs(ctx, "ref", inputs["samples"])[1]}
