"""KL estimators and entropy, against hand-computed values and their defining properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distflow.algorithms import KL_ESTIMATORS, entropy_from_logits, kl_divergence
from distflow.algorithms.kl import K3_BOUND

LOGPROB = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])  # log r = ref - logprob = [-0.5, 1.0]


def test_estimators_by_hand():
    torch.testing.assert_close(kl_divergence(LOGPROB, REF, "k1"), torch.tensor([[0.5, -1.0]]))  # -log r
    torch.testing.assert_close(
        kl_divergence(LOGPROB, REF, "k2"), torch.tensor([[0.125, 0.5]])
    )  # (log r)^2 / 2
    # r - 1 - log r: e^-0.5 - 1 + 0.5 = 0.1065307, e^1 - 1 - 1 = 0.7182818
    torch.testing.assert_close(kl_divergence(LOGPROB, REF, "k3"), torch.tensor([[0.1065307, 0.7182818]]))


def test_k3_is_bounded():
    # log r = 5: e^5 - 6 = 142.4; log r = -30: clamped to -20, e^-20 + 19 = 19; both capped at the bound.
    kl = kl_divergence(torch.tensor([0.0, 0.0]), torch.tensor([5.0, -30.0]), "k3")
    torch.testing.assert_close(kl, torch.full((2,), K3_BOUND))


def test_unknown_estimator_names_the_valid_ones():
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_divergence(LOGPROB, REF, "k4")


logprobs = st.floats(-50.0, 0.0, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(logprobs, min_size=1, max_size=8))
def test_every_estimator_is_exactly_zero_at_equality(values):
    logprob = torch.tensor(values)
    for estimator in KL_ESTIMATORS:
        assert torch.equal(kl_divergence(logprob, logprob.clone(), estimator), torch.zeros_like(logprob))


@settings(max_examples=100, deadline=None)
@given(pairs=st.lists(st.tuples(logprobs, logprobs), min_size=1, max_size=8))
def test_k3_and_k2_are_non_negative(pairs):
    logprob, ref = torch.tensor(pairs).unbind(-1)
    assert (kl_divergence(logprob, ref, "k3") >= 0).all()
    assert (kl_divergence(logprob, ref, "k2") >= 0).all()


def test_k3_non_negative_at_tiny_ratios():
    # exp(x) - x - 1 rounds below 0 in float32 near x = 3e-8; the estimator must not.
    ref = torch.tensor([3e-8, -3e-8, 1e-7, -1e-7, 1e-12])
    assert (kl_divergence(torch.zeros(5), ref, "k3") >= 0).all()


def test_entropy_by_hand():
    # p = [1/4, 3/4] from logits [0, ln 3]: H = 0.25 ln 4 + 0.75 ln(4/3) = 0.3465736 + 0.2157616
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([0.5623351, math.log(2.0)]))


def test_entropy_is_finite_for_extreme_logits_and_upcasts_half_precision():
    # softmax underflows to exactly 0 for the first token; entropy is ~0, not NaN.
    assert entropy_from_logits(torch.tensor([0.0, 1000.0])).item() == pytest.approx(0.0, abs=1e-6)
    assert entropy_from_logits(torch.zeros(2, 3, 5, dtype=torch.bfloat16)).dtype == torch.float32


def test_entropy_matches_categorical():
    logits = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(0))
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected)
