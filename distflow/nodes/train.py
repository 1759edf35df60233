"""train_actor: one policy update over the moved batch (mini-batches and micro-batches inside the worker).

The log-probs the PPO ratio is taken against (distflow.config.algorithm.recomputes_old_logprobs says when
the old_logprob pass runs):
- with a rollout correction (algorithm.rollout_correction): the proximal policy, the one before the
  update (below), and each token is weighed by how far the engine's sampling policy was from it
  (decoupled PPO: docs/rollout_correction.md);
- else, stale samples (rollout.max_staleness > 0): the sampling policy's, the engine's rollout log-probs, so
  clipping bounds the update's distance from the policy that sampled (docs/async.md);
- else, on-policy: the policy's before the update.
The policy before the update is the old_logprob pass's, or, where the pipeline skips that pass (one update
per batch), the update's own forward, detached.
Without the pass, the update's forward also reports the engine-vs-actor metrics (nodes/logprob.py)."""

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
    corrected = ctx.cfg.algorithm.rollout_correction.enabled
    if ctx.cfg.rollout.max_staleness > 0 and not corrected:
        ratio_against = "rollout_logprobs"
    elif recomputed:
        batch["old_logprobs"] = inputs["old_logprobs"]
        ratio_against = "old_logprobs"
    else:
        ratio_against = None  # the update's own forward
    if "ref_logprobs" in inputs:
        batch["ref_logprobs"] = inputs["ref_logprobs"]
    algo = ctx.cfg.algorithm

    def loss_fn(logprobs, entropy, mb):
        loss, metrics = policy_loss(
            logprobs,
            mb[ratio_against] if ratio_against else logprobs.detach(),
            mb["advantages"],
            mb["response_mask"],
            algo,
            entropy=entropy,
            ref_logprob=mb.get("ref_logprobs"),
            rollout_logprob=mb["rollout_logprobs"],
        )
        if not recomputed:
            metrics.update(engine_gap_metrics(logprobs, entropy, mb["rollout_logprobs"], mb["response_mask"]))
        return loss, metrics

    metrics = ctx.workers.actor.train_step(batch, loss_fn)
    ctx.record(
        **{
            (k if k.startswith(("rollout/", "rollout_corr/")) else f"actor/{k}"): v
            for k, v in metrics.items()
            if isinstance(v, (int, float))
        }
    )
    return {"actor_metrics": metrics}
