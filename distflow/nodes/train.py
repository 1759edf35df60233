"""train_actor: one policy update over the moved batch (mini-batches and micro-batches inside the worker)."""

from distflow.algorithms.policy_loss import policy_loss
from distflow.batch import to_padded


def train_actor(ctx, inputs):
    batch = to_padded(inputs["samples"])
    advantages = inputs["advantages"]
    if "advantages" in advantages.row_counts:  # token-level (GAE, REINFORCE++), aligned with input_ids
        batch["advantages"] = to_padded(advantages)["advantages"] * batch["response_mask"]
    else:  # one outcome advantage per sample, on each of its response tokens
        batch["advantages"] = advantages.sorted_by_id().fields["advantages"][:, None] * batch["response_mask"]
    batch["old_logprobs"] = inputs["old_logprobs"]
    if "ref_logprobs" in inputs:
        batch["ref_logprobs"] = inputs["ref_logprobs"]
    algo = ctx.cfg.algorithm

    def loss_fn(logprobs, entropy, mb):
        return policy_loss(
            logprobs,
            mb["old_logprobs"],
            mb["advantages"],
            mb["response_mask"],
            algo,
            entropy=entropy,
            ref_logprob=mb.get("ref_logprobs"),
        )

    metrics = ctx.workers.actor.train_step(batch, loss_fn)
    ctx.record(**{f"actor/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))})
    return {"actor_metrics": metrics}
