"""train_actor: one policy update over the moved batch (mini-batches and micro-batches inside the worker).

Without an old_logprobs input (the pipeline skipped that pass: distflow.config.algorithm.
recomputes_old_logprobs) the update's own forward is the old policy's: its detached log-probs are the old
ones, and it reports the engine-vs-actor metrics the skipped pass would have (nodes/logprob.py)."""

from distflow.algorithms.policy_loss import policy_loss
from distflow.batch import to_padded
from distflow.nodes.logprob import engine_gap_metrics


def train_actor(ctx, inputs):
    batch = to_padded(inputs["samples"])
    advantages = inputs["advantages"]
    if "advantages" in advantages.row_counts:  # token-level (GAE, REINFORCE++), aligned with input_ids
        batch["advantages"] = to_padded(advantages)["advantages"] * batch["response_mask"]
    else:  # one outcome advantage per sample, on each of its response tokens
        batch["advantages"] = advantages.sorted_by_id().fields["advantages"][:, None] * batch["response_mask"]
    recomputed = "old_logprobs" in inputs
    if recomputed:
        batch["old_logprobs"] = inputs["old_logprobs"]
    if "ref_logprobs" in inputs:
        batch["ref_logprobs"] = inputs["ref_logprobs"]
    algo = ctx.cfg.algorithm

    def loss_fn(logprobs, entropy, mb):
        loss, metrics = policy_loss(
            logprobs,
            mb["old_logprobs"] if recomputed else logprobs.detach(),
            mb["advantages"],
            mb["response_mask"],
            algo,
            entropy=entropy,
            ref_logprob=mb.get("ref_logprobs"),
        )
        if not recomputed:
            metrics.update(engine_gap_metrics(logprobs, entropy, mb["rollout_logprobs"], mb["response_mask"]))
        return loss, metrics

    metrics = ctx.workers.actor.train_step(batch, loss_fn)
    ctx.record(
        **{
            (k if k.startswith("rollout/") else f"actor/{k}"): v
            for k, v in metrics.items()
            if isinstance(v, (int, float))
        }
    )
    return {"actor_metrics": metrics}
