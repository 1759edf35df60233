"""Synthetic RL batches for the data-coordinator tests, and the consumer view a plan should produce.

Every rank builds the same global batch from a seed and keeps its holder's share, so a multi-process
test needs no communication to know what every rank should end up with.
"""

import numpy as np
import torch

from distflow.coordination.data import FieldPlacement, PackedBatch, PlacedLayout, RedistributionPlan

# Every kind of field: ragged int64/float32/bfloat16/bool token runs, a fixed scalar, a fixed vector.
FIELDS = FieldPlacement(
    {
        "input_ids": "first",
        "old_logprobs": "last",
        "advantages": "last",
        "attention_mask": "all",
        "rewards": "last",
        "scores": "all",
    }
)


def synthetic_batches(
    producer: PlacedLayout,
    num_groups: int,
    group_size: int,
    seed: int = 0,
    max_len: int = 300,
    empty_holders: tuple[int, ...] = (),
) -> dict[int, PackedBatch]:
    """{holder rank: its batch}: whole groups, dealt to holders at random, long-tailed lengths; sample
    ids are shuffled so that no holder's ids are a contiguous range. Holders in empty_holders get none."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    holders = [h for h in producer.holders if h not in empty_holders]
    n = num_groups * group_size
    ids = rng.permutation(n * 3)[:n]
    groups = np.repeat(rng.permutation(num_groups * 5)[:num_groups], group_size)
    lengths = np.clip(rng.lognormal(np.log(max_len / 6), 1.0, n), 1, max_len).astype(np.int64)
    owner = np.repeat(rng.integers(0, len(holders), num_groups), group_size) if holders else np.zeros(n, int)
    batches = {}
    for i, h in enumerate(producer.holders):
        mine = np.flatnonzero(owner == holders.index(h)) if h in holders else np.zeros(0, dtype=np.int64)
        batches[h] = _batch(ids[mine], groups[mine], lengths[mine], gen)
    return batches


def _batch(ids, groups, lengths, gen) -> PackedBatch:
    total = int(lengths.sum())
    response = torch.from_numpy(lengths // 2 + 1)
    num = len(ids)
    return PackedBatch(
        ids,
        groups,
        lengths,
        {
            "input_ids": torch.randint(0, 32000, (total,), generator=gen),
            "old_logprobs": -torch.rand(total, generator=gen),
            "advantages": torch.randn(int(response.sum()), generator=gen).to(torch.bfloat16),
            "attention_mask": torch.rand(total, generator=gen) > 0.1,
            "rewards": torch.randn(num, generator=gen),
            "scores": torch.randn(num, 3, generator=gen, dtype=torch.float64),
        },
        {"input_ids": lengths, "old_logprobs": lengths, "advantages": response, "attention_mask": lengths},
    )


def expected_view(batches: dict[int, PackedBatch], plan: RedistributionPlan, rank: int):
    """What `rank` should get: its DP group's samples (by sample id) with the fields of its stage."""
    if not plan.consumer.contains(rank):
        return None
    everything = PackedBatch.concat(list(batches.values())).sorted_by_id()
    assert np.array_equal(everything.sample_ids.numpy(), plan.table.sample_ids)
    return everything.select(torch.from_numpy(plan.consumer_positions(rank)), plan.consumer_fields(rank))


def simulate(plan: RedistributionPlan, batches: dict[int, PackedBatch]) -> dict[int, PackedBatch]:
    """Runs the plan in one process through the real send/receive code: {consumer rank: its batch}."""
    from distflow.coordination.data.transport import Receiver, outgoing

    ranks = sorted(set(plan.consumer.ranks) | set(plan.producer.ranks))
    local = {r: batches[r].sorted_by_id() if r in batches else None for r in ranks}
    sent = {}
    for r in ranks:
        for dst, name, tensor in outgoing(plan, r, local[r], "cpu"):
            assert (r, dst, name) not in sent
            sent[(r, dst, name)] = tensor.clone()
    out = {}
    for r in plan.consumer.ranks:
        receiver = Receiver(plan, r, local[r], "cpu")
        for src, name, target in receiver.targets:
            message = sent.pop((src, r, name))
            assert message.shape == target.shape and message.dtype == target.dtype
            target.copy_(message)
        receiver.copy_kept()
        out[r] = receiver.finish()
    assert not sent, f"messages nobody received: {sorted(sent)}"
    return out
