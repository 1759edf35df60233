"""Turning outcome rewards into per-token rewards: placement at the last token, KL penalty, DAPO overlong penalty.

Token rewards are [batch, seq] tensors aligned with `response_mask`; they are 0 off the mask.
"""

import torch

from distflow.algorithms.kl import kl_divergence


def last_token_positions(response_mask: torch.Tensor) -> torch.Tensor:
    """Index [batch] of each row's last masked token (0 for a row with none)."""
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    return torch.where(response_mask.bool(), positions, 0).amax(dim=-1)


def outcome_token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar reward ([batch]) on its last response token: [batch, seq], 0 elsewhere.

    A row without response tokens gets no reward anywhere.
    """
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    mask = response_mask.bool()
    token_rewards = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    rows = torch.arange(mask.shape[0], device=mask.device)
    token_rewards[rows, last_token_positions(mask)] = torch.where(mask.any(dim=-1), rewards, 0)
    return token_rewards


@torch.no_grad()
def apply_kl_penalty(
    token_rewards: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    kl_coef: float,
    estimator: str,
    mask: torch.Tensor,
) -> torch.Tensor:
    """token_rewards - kl_coef * KL_t on the masked tokens (algorithm.kl_in_reward): the KL to the reference
    becomes part of the return instead of a loss term. Returns a new [batch, seq] tensor without gradient.
    """
    penalty = torch.where(mask.bool(), kl_divergence(logprob, ref_logprob, estimator), 0)
    return token_rewards - kl_coef * penalty


def overlong_penalty(
    response_lengths: torch.Tensor, max_len: int, buffer_len: int, factor: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment, a reward term [batch] added to the outcome reward.

    0 while length <= max_len - buffer_len, then linear down to -factor at max_len (and -factor beyond, should
    a length exceed max_len). buffer_len = 0 disables it (all zeros), as `algorithm.overlong_buffer_len` does.
    """
    lengths = torch.as_tensor(response_lengths, dtype=torch.float32)
    if buffer_len <= 0:
        return torch.zeros_like(lengths)
    if buffer_len > max_len:
        raise ValueError(f"overlong buffer_len ({buffer_len}) exceeds max_len ({max_len})")
    excess = (lengths - (max_len - buffer_len)).clamp(0, buffer_len)
    return -factor * excess / buffer_len
