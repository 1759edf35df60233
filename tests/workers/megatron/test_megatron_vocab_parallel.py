"""The worker's log-prob + entropy autograd function on one rank (the TP all-reduces are covered by the
torchrun jobs of test_megatron_worker.py): values against the plain formulas, and the hand-written backward against
finite differences, padding columns included."""

import torch

from distflow.algorithms.entropy import entropy_from_logits
from distflow.workers.megatron.vocab_parallel import _LogprobEntropy, shift_to_token_positions


def _apply(logits, targets, real_columns):
    return _LogprobEntropy.apply(logits, targets, 0, real_columns, None)


def test_values_equal_log_softmax_and_entropy_and_padding_is_ignored():
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2, 5, 11, generator=gen)
    targets = torch.randint(0, 11, (2, 5), generator=gen)
    logprobs, entropy = _apply(logits, targets, 11)
    expected = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(logprobs, expected)
    torch.testing.assert_close(entropy, entropy_from_logits(logits))
    # Vocabulary padding (Megatron's extra output rows) holds arbitrary logits: it must change nothing.
    padded = torch.cat([logits, 50 * torch.ones(2, 5, 5)], dim=-1)
    padded_logprobs, padded_entropy = _apply(padded, targets, 11)
    torch.testing.assert_close(padded_logprobs, logprobs)
    torch.testing.assert_close(padded_entropy, entropy)


def test_backward_matches_finite_differences_with_padding_columns():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 7, (3, 4), generator=gen)
    weights = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)

    def loss(z):
        logprobs, entropy = _apply(z, targets, 7)  # columns 7, 8 are padding
        return (weights[0] * logprobs + weights[1] * entropy).sum()

    assert torch.autograd.gradcheck(loss, (logits,))
    loss(logits).backward()
    assert torch.all(logits.grad[..., 7:] == 0)


def test_shift_to_token_positions():
    per_position = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert shift_to_token_positions(per_position).tolist() == [[0.0, 1.0, 2.0], [0.0, 4.0, 5.0]]
