"""The padded [B, S] view of a PackedBatch (what the Megatron workers take) and the way back."""

import pytest
import torch

from distflow.batch import PackedBatch, from_padded, to_padded

PROMPT = 3
RESPONSES = [4, 2, 5, 3]  # response tokens per sample


def _samples() -> PackedBatch:
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(5, 50, (PROMPT + n,), generator=generator) for n in RESPONSES]
    masks = [torch.cat([torch.zeros(PROMPT), torch.ones(n)]) for n in RESPONSES]
    # Ids out of order: the padded rows come in sample-id order.
    return PackedBatch.from_samples(
        [12, 10, 13, 11],
        [7, 7, 9, 9],
        {"input_ids": ids, "response_mask": masks, "rewards": torch.tensor([1.0, 2.0, 3.0, 4.0])},
    )


def test_to_padded_rows_in_sample_id_order():
    samples = _samples()
    padded = to_padded(samples)
    lengths = [PROMPT + n for n in (2, 3, 4, 5)]  # ids 10, 11, 12, 13
    assert padded["input_ids"].shape == (4, max(lengths))
    assert padded["attention_mask"].sum(1).tolist() == lengths
    assert padded["rewards"].tolist() == [2.0, 4.0, 1.0, 3.0]  # fixed fields stay [B]
    assert padded["input_ids"][1, : lengths[1]].tolist() == samples.sample(3)["input_ids"].tolist()
    assert int(padded["input_ids"][0, lengths[0] :].abs().sum()) == 0


def test_from_padded_round_trips_token_level_fields():
    samples = _samples()
    batch = to_padded(samples)
    values = torch.randn(batch["input_ids"].shape) * batch["attention_mask"]
    packed = from_padded(samples, {"values": values})
    assert packed.sample_ids.tolist() == [10, 11, 12, 13]
    assert packed.row_counts["values"].tolist() == [PROMPT + 2, PROMPT + 3, PROMPT + 4, PROMPT + 5]
    torch.testing.assert_close(to_padded(packed)["values"], values)
    torch.testing.assert_close(to_padded(packed)["attention_mask"], batch["attention_mask"])


def test_a_ragged_field_of_other_length_is_refused():
    samples = _samples()
    bad = PackedBatch(
        samples.sample_ids,
        samples.groups,
        samples.lengths,
        {"input_ids": samples.fields["input_ids"], "other": torch.zeros(4)},
        {"input_ids": samples.row_counts["input_ids"], "other": torch.ones(4, dtype=torch.long)},
    )
    with pytest.raises(
        ValueError, match="ragged field 'other' does not have one row per token of 'input_ids'"
    ):
        to_padded(bad)


def test_a_token_field_with_an_inner_shape_pads_per_token():
    """MoE routes ([tokens, layers x top_k] per sample) pad like input_ids, keeping each token's row."""
    routes = [torch.arange(n * 4, dtype=torch.int16).reshape(n, 4) + 100 * i for i, n in enumerate((3, 5))]
    batch = PackedBatch.from_samples(
        [1, 0],
        [0, 0],
        {
            "input_ids": [torch.ones(3, dtype=torch.long), torch.ones(5, dtype=torch.long)],
            "routed_experts": routes,
        },
    )
    padded = to_padded(batch)
    assert padded["routed_experts"].shape == (2, 5, 4) and padded["routed_experts"].dtype == torch.int16
    assert torch.equal(padded["routed_experts"][0], routes[1])  # sample 0 (5 tokens) first
    assert torch.equal(padded["routed_experts"][1, :3], routes[0])
    assert not padded["routed_experts"][1, 3:].any()
    back = from_padded(batch, {"routed_experts": padded["routed_experts"]})
    assert torch.equal(back.fields["routed_experts"], torch.cat([routes[1], routes[0]]))
