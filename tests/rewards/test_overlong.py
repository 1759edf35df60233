"""DAPO's overlong reward shaping on a batch (distflow.rewards.overlong), against hand-computed values."""

import pytest
import torch

from distflow.batch import PackedBatch
from distflow.rewards.overlong import response_lengths, shape_overlong


def _batch(prompt_lens, response_lens, rewards):
    masks = [torch.cat([torch.zeros(p), torch.ones(r)]) for p, r in zip(prompt_lens, response_lens)]
    ids = list(range(10, 10 + len(masks)))
    samples = PackedBatch.from_samples(
        ids,
        [0] * len(ids),
        {"input_ids": [torch.zeros(len(m), dtype=torch.long) for m in masks], "response_mask": masks},
    )
    return samples, PackedBatch(
        samples.sample_ids, samples.groups, samples.lengths, {"rewards": torch.tensor(rewards)}
    )


def test_response_lengths_come_from_the_mask():
    samples, _ = _batch([3, 5, 2], [4, 0, 8], [0.0, 0.0, 0.0])
    assert response_lengths(samples).tolist() == [4, 0, 8]


def test_penalty_ramps_over_the_buffer():
    # max_new_tokens 8, buffer 4: no penalty up to 4 tokens, then -factor * (len - 4) / 4
    samples, rewards = _batch([3] * 5, [2, 4, 5, 7, 8], [1.0, 1.0, 0.5, 0.0, 1.0])
    shaped, penalty = shape_overlong(samples, rewards, max_new_tokens=8, buffer_len=4, factor=0.5)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -0.125, -0.375, -0.5])
    assert shaped.fields["rewards"].tolist() == pytest.approx([1.0, 1.0, 0.375, -0.375, 0.5])
    assert torch.equal(shaped.sample_ids, rewards.sample_ids) and torch.equal(shaped.groups, rewards.groups)


def test_zero_buffer_leaves_rewards_alone():
    samples, rewards = _batch([3, 3], [8, 8], [1.0, 0.0])
    shaped, penalty = shape_overlong(samples, rewards, 8, 0, 1.0)
    assert shaped is rewards and penalty.tolist() == [0.0, 0.0]


def test_rewards_in_another_order_are_refused():
    samples, rewards = _batch([3, 3], [2, 2], [1.0, 0.0])
    flipped = rewards.select([1, 0])
    with pytest.raises(ValueError, match="rewards must come in the samples' order"):
        shape_overlong(samples, flipped, 8, 2, 1.0)
