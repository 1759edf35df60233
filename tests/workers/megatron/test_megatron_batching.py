"""Mini-/micro-batch planning of the Megatron worker: pure functions, checked by hand and by brute force."""

import itertools
import random

import pytest
import torch

from distflow.workers.megatron import batching


def _brute_force_min_count(lengths, budget):
    """Fewest groups with padded cost <= budget, by trying every assignment (tiny inputs only)."""
    n = len(lengths)
    for k in range(1, n + 1):
        for labels in itertools.product(range(k), repeat=n):
            groups = [[i for i in range(n) if labels[i] == g] for g in range(k)]
            if all(groups) and all(batching.padded_cost(lengths, g) <= budget for g in groups):
                return k
    raise AssertionError("unreachable")


def test_sequence_lengths_of_right_padded_rows():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert batching.sequence_lengths(mask) == [3, 1, 0, 4]


@pytest.mark.parametrize("seed", range(30))
def test_token_budget_uses_fewest_micro_batches_within_budget(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 7))]
    budget = rng.randint(max(lengths), 40)
    groups = batching.token_budget_micro_batches(lengths, budget)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(g == sorted(g) and batching.padded_cost(lengths, g) <= budget for g in groups)
    assert len(groups) == _brute_force_min_count(lengths, budget)


def test_token_budget_balances_padded_cost():
    # Longest-first filling gives [10, 9, 2, 2] (padded cost 40) and [2, 2] (cost 4); the balanced split
    # keeps two micro-batches but evens their costs out.
    lengths = [10, 9, 2, 2, 2, 2]
    groups = batching.token_budget_micro_batches(lengths, 40)
    costs = sorted(batching.padded_cost(lengths, g) for g in groups)
    assert len(groups) == 2 and costs == [27, 30], groups
    # When balancing cannot place every row within the budget, the longest-first filling stands.
    groups = batching.token_budget_micro_batches(lengths, 20)
    assert groups == [[0, 1], [2, 3, 4, 5]]


def test_token_budget_rounds_up_to_a_multiple_for_the_interleaved_schedule():
    lengths = [5, 5, 5, 5, 5]
    assert len(batching.token_budget_micro_batches(lengths, 100)) == 1
    groups = batching.token_budget_micro_batches(lengths, 100, multiple_of=2)
    assert len(groups) == 2 and sorted(i for g in groups for i in g) == list(range(5))
    with pytest.raises(ValueError, match="cannot fill 6 micro-batches"):
        batching.token_budget_micro_batches(lengths, 5, multiple_of=6)


def test_token_budget_smaller_than_a_sequence_is_an_error():
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=8 is smaller than the longest sequence"):
        batching.token_budget_micro_batches([3, 9], 8)


def test_fixed_micro_batches():
    assert batching.fixed_micro_batches(7, 3) == [[0, 1], [2, 3, 4], [5, 6]]
    assert batching.fixed_micro_batches(4, 4, multiple_of=2) == [[0, 1], [2, 3]]
    assert batching.fixed_micro_batches(2, 1) == [[0], [1]]


def test_mini_batch_ranges():
    assert batching.mini_batch_ranges(8, 0) == [range(0, 8)]
    assert batching.mini_batch_ranges(8, 3) == [range(0, 3), range(3, 6), range(6, 8)]


def test_micro_batch_trims_pads_and_scatters_back():
    batch = {
        "input_ids": torch.arange(12).reshape(3, 4),
        "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]]),
        "row_value": torch.tensor([7.0, 8.0, 9.0]),
    }
    lengths = batching.sequence_lengths(batch["attention_mask"])
    mb = batching.micro_batch(batch, [0, 2], lengths)
    assert mb["input_ids"].tolist() == [[0, 1], [8, 9]] and mb["row_value"].tolist() == [7.0, 9.0]
    mb = batching.micro_batch(batch, [0, 2], lengths, pad_multiple=4)
    assert mb["input_ids"].shape == (2, 4)
    fixed = batching.micro_batch(batch, [2], lengths, shape=(2, 5))
    assert fixed["input_ids"].tolist() == [[8, 9, 10, 11, 0], [0, 0, 0, 0, 0]]
    assert fixed["attention_mask"][1].sum() == 0
    groups = [[1], [0, 2]]
    parts = [batching.micro_batch(batch, g, lengths, shape=(2, 3))["input_ids"].float() for g in groups]
    back = batching.scatter_rows(parts, groups, 3, 4)
    assert back.tolist() == [[0, 1, 2, 0], [4, 5, 6, 0], [8, 9, 10, 0]]
