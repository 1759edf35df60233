"""critic_values / train_critic: the critic's forward pass and its clipped value regression (PPO).

Both run in the critic's training layout. Values are token-level: values[:, t] is the critic's estimate of
the return from just before response token t (MegatronWorker's alignment), which is what GAE reads.
"""

from distflow.algorithms.aggregation import masked_mean
from distflow.algorithms.value_loss import value_loss
from distflow.batch import from_padded, to_padded


def critic_values(ctx, inputs):
    """values: a PackedBatch with a token-level `values` field (can move to another layout)."""
    samples = inputs["samples"]
    values = ctx.workers.critic.compute_values(to_padded(samples))
    return {"values": from_padded(samples, {"values": values})}


def train_critic(ctx, inputs):
    """One critic update (critic.ppo_epochs x mini-batches) towards the advantage node's returns.

    The loss is 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip within algorithm.value_clip of the values the
    advantages were computed with, token-mean over the response tokens (the worker's convention).
    """
    batch = to_padded(inputs["samples"])
    batch["old_values"] = to_padded(inputs["values"])["values"]
    batch["returns"] = to_padded(inputs["returns"])["returns"]
    clip = ctx.cfg.algorithm.value_clip

    def loss_fn(values, mb):
        loss, metrics = value_loss(
            values,
            mb["old_values"],
            mb["returns"],
            mb["response_mask"],
            clip_range=clip if clip > 0 else None,
            loss_agg_mode="token-mean",
        )
        metrics["values_mean"] = masked_mean(values.detach(), mb["response_mask"])
        return loss, metrics

    metrics = ctx.workers.critic.train_step(batch, loss_fn)
    keep = ("vf_loss", "vf_clipfrac", "values_mean", "grad_norm", "lr", "skipped_steps")
    ctx.record(**{f"critic/{k}": metrics[k] for k in keep})
    return {"critic_metrics": metrics}
