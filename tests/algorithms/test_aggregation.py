"""Loss aggregation modes and masked statistics, against hand-computed values."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distflow.algorithms import LOSS_AGG_MODES, aggregate, masked_mean, masked_var, masked_whiten

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])  # row 0 has 2 response tokens, row 1 has 3


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 18 / 5),  # (1 + 2 + 4 + 5 + 6) / 5 tokens
        ("seq-mean-token-sum", (3 + 15) / 2),  # row sums 3 and 15, mean over 2 rows
        ("seq-mean-token-mean", (3 / 2 + 15 / 3) / 2),  # row means 1.5 and 5 -> 3.25
        ("seq-mean-token-sum-norm", (3 / 3 + 15 / 3) / 2),  # row sums / padded length 3 -> (1 + 5) / 2
    ],
)
def test_modes_by_hand(mode, expected):
    assert aggregate(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_sum_norm_uses_the_given_constant():
    # (3 / 10 + 15 / 10) / 2 = 0.9
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=10).item() == pytest.approx(0.9)


def test_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError) as error:
        aggregate(LOSS, MASK, "token-sum")
    assert all(mode in str(error.value) for mode in LOSS_AGG_MODES)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_padding_cannot_leak_and_empty_rows_are_not_sequences(mode):
    # An all-padding third row and an inf on a padding token change nothing.
    loss = torch.cat([LOSS, torch.full((1, 3), 7.0)])
    loss[0, 2] = math.inf
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    assert aggregate(loss, mask, mode).item() == pytest.approx(aggregate(LOSS, MASK, mode).item())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_empty_mask_gives_zero(mode):
    assert aggregate(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def test_masked_mean_var_whiten_by_hand():
    values = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[True, True], [True, False]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert masked_var(values, mask).item() == pytest.approx(1.0)  # (1 + 0 + 1) / (3 - 1)
    expected = torch.tensor([[-1.0, 0.0], [1.0, 0.0]])  # (x - 2) / sqrt(1), 0 off the mask
    torch.testing.assert_close(masked_whiten(values, mask), expected, atol=1e-6, rtol=0)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 5), length=st.integers(1, 6), pad=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_token_mean_equals_seq_mean_token_mean_for_equal_lengths(batch, length, pad, seed):
    generator = torch.Generator().manual_seed(seed)
    loss = torch.randn(batch, length + pad, generator=generator, dtype=torch.float64)
    mask = torch.zeros(batch, length + pad)
    mask[:, :length] = 1
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(
        aggregate(loss, mask, "seq-mean-token-mean").item(), abs=1e-12
    )
