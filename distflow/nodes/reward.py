"""score: rule-based / custom rewards per sample, where the samples were generated."""
import torch

from distflow.coordination.data import PackedBatch
from distflow.rewards.pool import RewardSample


def score(ctx, inputs):
    samples = inputs["samples"]
    if samples is None:
        return {"rewards": None}
    infos = ctx.rollout.infos
    eos = ctx.tokenizer.eos_token_id
    to_score = []
    for sample_id in samples.sample_ids.tolist():
        info = infos[sample_id]
        text = ctx.tokenizer.decode(info.response_ids, skip_special_tokens=True)
        ended = info.finish_reason == "stop" and bool(info.response_ids) and info.response_ids[-1] == eos
        to_score.append(RewardSample(text, info.ground_truth, info.data_source, ended, info.extra_info))
    rewards, stats = ctx.reward_pool.score_batch(to_score)
    ctx.record(**stats)
    return {"rewards": PackedBatch(samples.sample_ids, samples.groups, samples.lengths,
                                   {"rewards": torch.tensor(rewards, dtype=torch.float32)})}
