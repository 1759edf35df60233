"""score: rule-based / custom rewards per sample, where the samples were generated.
model_score: a reward model's score per sample, in the training layout (reward.model_path)."""

import math
import time

import torch

from distflow.batch import to_padded
from distflow.coordination.data import PackedBatch
from distflow.rewards.pool import RewardSample


def score(ctx, inputs):
    rewards, metrics = score_samples(ctx, inputs["samples"], streamed=True)
    ctx.record(**metrics)
    return {"rewards": rewards}


def score_samples(
    ctx, samples: PackedBatch | None, streamed: bool = False
) -> tuple[PackedBatch | None, dict[str, float]]:
    """(a `rewards` batch over `samples` or None, the reward/* metrics): the work of the score node, for
    callers that score more than once in a step (dynamic sampling, validation) and keep what they choose.
    streamed: take the rewards of samples the generation submitted as their groups finished
    (reward.stream, nodes/rollout.py), and put when they were scored on the timeline."""
    if samples is None:
        return None, {}
    sample_ids = samples.sample_ids.tolist()
    to_score = [  # multi-turn: the outcome is in the policy's last turn
        reward_sample(ctx.tokenizer, info.response_ids[info.final_turn :], info.finish_reason, info)
        for info in (samples.infos[i] for i in sample_ids)
    ]
    pool = ctx.workers.reward_pool
    rewards, stats = pool.score_batch(to_score, keys=sample_ids if streamed else None)
    if streamed and pool.last_stream is not None:
        first, last, count = pool.last_stream
        ctx.span("reward_stream", wall_clock(first), wall_clock(last), samples=count)
    metrics = {
        **stats,
        "reward/samples": len(rewards),
    }  # reward/samples: the weight of reward/mean over ranks
    coef = ctx.cfg.reward.env_reward_coef
    if coef:
        rewards, metrics["reward/env_mean"] = with_env_rewards(
            rewards, [samples.infos[i] for i in sample_ids], coef
        )
    batch = PackedBatch(
        samples.sample_ids,
        samples.groups,
        samples.lengths,
        {"rewards": torch.tensor(rewards, dtype=torch.float32)},
    )
    return batch, {k: float(v) for k, v in metrics.items()}


def with_env_rewards(rewards: list[float], infos, coef: float) -> tuple[list[float], float]:
    """(each outcome reward plus coef x its trajectory's summed per-step environment rewards, the mean of
    the added terms): reward.env_reward_coef. reward/mean stays the scorer's outcome alone."""
    added = [coef * ((info.env or {}).get("env_reward", 0.0)) for info in infos]
    return [r + a for r, a in zip(rewards, added, strict=True)], sum(added) / max(len(added), 1)


def reward_sample(tokenizer, response_ids, finish_reason: str, source) -> RewardSample:
    """What a scorer sees of one response: its text, and the ground truth, data source and extra info of its
    prompt (`source`: the prompt, or the sample's info, which carries them)."""
    ended = finish_reason == "stop" and bool(response_ids) and response_ids[-1] == tokenizer.eos_token_id
    text = tokenizer.decode(response_ids, skip_special_tokens=True)
    return RewardSample(text, source.ground_truth, source.data_source, ended, source.extra_info)


def wall_clock(monotonic: float) -> float:
    """time.time() of a past time.monotonic() reading (timeline rows are wall-clock)."""
    return time.time() - (time.monotonic() - monotonic)


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
