"""DAPO's overlong reward shaping on a batch: the scorer's reward plus a soft penalty for long responses.

The penalty itself is the pure function distflow.algorithms.reward_shaping.overlong_penalty (0 up to
max_new_tokens - overlong_buffer_len response tokens, then linear down to -overlong_penalty_factor at
max_new_tokens). This module applies it to a PackedBatch of rewards, taking each response's length from the
samples' response mask, so it needs nothing beyond what travels with the samples.
"""

import torch

from distflow.algorithms.reward_shaping import overlong_penalty
from distflow.batch import PackedBatch


def response_lengths(samples: PackedBatch) -> torch.Tensor:
    """Response tokens per sample [n] (the sum of each sample's response_mask run)."""
    counts = samples.rows("response_mask")
    owner = torch.repeat_interleave(torch.arange(len(samples)), counts)
    mask = samples.fields["response_mask"].to(torch.float32)
    return torch.zeros(len(samples), dtype=torch.float32).index_add_(0, owner, mask).round().long()


def shape_overlong(
    samples: PackedBatch, rewards: PackedBatch, max_new_tokens: int, buffer_len: int, factor: float
) -> tuple[PackedBatch, torch.Tensor]:
    """(rewards + overlong penalty, the penalty [n]). `rewards` must list the samples' ids in their order.
    buffer_len = 0 returns `rewards` itself and a zero penalty."""
    if not torch.equal(samples.sample_ids, rewards.sample_ids):
        raise ValueError("overlong shaping: rewards must come in the samples' order (sample ids differ)")
    if buffer_len <= 0:
        return rewards, torch.zeros(len(samples))
    penalty = overlong_penalty(response_lengths(samples), max_new_tokens, buffer_len, factor)
    shaped = rewards.fields["rewards"] + penalty.to(rewards.fields["rewards"].dtype)
    return PackedBatch(rewards.sample_ids, rewards.groups, rewards.lengths, {"rewards": shaped}), penalty
