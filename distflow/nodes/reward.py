"""score: rule-based / custom rewards per sample, where the samples were generated.
model_score: a reward model's score per sample, in the training layout (reward.model_path)."""

import math

import torch

from distflow.batch import to_padded
from distflow.coordination.data import PackedBatch
from distflow.rewards.pool import RewardSample


def score(ctx, inputs):
    rewards, metrics = score_samples(ctx, inputs["samples"])
    ctx.record(**metrics)
    return {"rewards": rewards}


def score_samples(ctx, samples: PackedBatch | None) -> tuple[PackedBatch | None, dict[str, float]]:
    """(a `rewards` batch over `samples` or None, the reward/* metrics): the work of the score node, for
    callers that score more than once in a step (dynamic sampling, validation) and keep what they choose."""
    if samples is None:
        return None, {}
    eos = ctx.tokenizer.eos_token_id
    to_score = []
    for sample_id in samples.sample_ids.tolist():
        info = samples.infos[sample_id]
        text = ctx.tokenizer.decode(info.response_ids, skip_special_tokens=True)
        ended = info.finish_reason == "stop" and bool(info.response_ids) and info.response_ids[-1] == eos
        to_score.append(RewardSample(text, info.ground_truth, info.data_source, ended, info.extra_info))
    rewards, stats = ctx.workers.reward_pool.score_batch(to_score)
    metrics = {
        **stats,
        "reward/samples": len(rewards),
    }  # reward/samples: the weight of reward/mean over ranks
    batch = PackedBatch(
        samples.sample_ids,
        samples.groups,
        samples.lengths,
        {"rewards": torch.tensor(rewards, dtype=torch.float32)},
    )
    return batch, {k: float(v) for k, v in metrics.items()}


def model_score(ctx, inputs):
    """The reward model's scalar for each whole sequence (prompt + response, as generated), on every rank of
    the actor's layout; every TP/PP rank of a replica returns the same rewards for its replica's rows."""
    samples = inputs["samples"].sorted_by_id()
    scores = ctx.workers.reward_model.compute_scores(to_padded(samples)).float().cpu()
    values = scores.tolist()
    if values:
        ctx.record(
            **{
                "reward/mean": math.fsum(values) / len(values),
                "reward/max": max(values),
                "reward/min": min(values),
            }
        )
    return {"rewards": PackedBatch(samples.sample_ids, samples.groups, samples.lengths, {"rewards": scores})}
