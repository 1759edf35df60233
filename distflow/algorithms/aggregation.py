"""Masked reductions over padded [batch, seq] tensors: the loss aggregation modes, masked means and whitening.

`mask` is 1 (or True) on the tokens that count and 0 on prompt and padding tokens; it may be bool, int or
float. Masked-out entries are selected away with `torch.where` rather than multiplied by 0, so an inf or NaN
in padding cannot leak into a result (0 * inf is NaN).
"""

from typing import Optional

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set, over `dim` (all elements when None)."""
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_count(mask: torch.Tensor, dim: Optional[int] = None, dtype=torch.float32) -> torch.Tensor:
    """Number of set entries of `mask` over `dim`, as `dtype` (so it can divide)."""
    counts = mask.bool().to(dtype)
    return counts.sum() if dim is None else counts.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set; 0 where nothing is set (an empty micro-batch is not an error)."""
    return masked_sum(values, mask, dim) / masked_count(mask, dim, values.dtype).clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (n - 1) variance of the masked entries, over the whole tensor; 0 with fewer than two entries.

    Unbiased to match the unbiased group std of GRPO (`torch.std`), so every estimator here uses one convention.
    """
    centred = values - masked_mean(values, mask)
    return masked_sum(centred * centred, mask) / (masked_count(mask, None, values.dtype) - 1).clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) with mean and unbiased var over the masked entries; 0 off the mask."""
    whitened = (values - masked_mean(values, mask)) * torch.rsqrt(masked_var(values, mask) + eps)
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=values.dtype, device=values.device))


def aggregate(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: Optional[float] = None
) -> torch.Tensor:
    """Reduce per-token losses `loss_mat` [batch, seq] under `mask` [batch, seq] to a scalar.

    Modes:
      token-mean               sum over every masked token / number of masked tokens (long answers weigh more);
      seq-mean-token-sum       per-sequence token sum, then mean over sequences;
      seq-mean-token-mean      per-sequence token mean, then mean over sequences (every answer weighs the same);
      seq-mean-token-sum-norm  per-sequence token sum / `norm_length`, then mean over sequences (Dr. GRPO: a
                               constant divisor removes the length bias of per-sequence means). `norm_length`
                               defaults to seq, the padded length; it is ignored by the other modes.
    "Sequences" are the rows with at least one masked token: an all-padding row is not a sample.
    All means are over this call's tensor: a caller that splits a batch into micro-batches must reweight the
    results (e.g. by its share of tokens or sequences) for them to add up to the batch's aggregate.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)

    token_sums = masked_sum(loss_mat, mask, dim=-1)
    lengths = masked_count(mask, -1, loss_mat.dtype)
    if mode == "seq-mean-token-sum":
        per_sequence = token_sums
    elif mode == "seq-mean-token-mean":
        per_sequence = token_sums / lengths.clamp(min=1)
    else:
        per_sequence = token_sums / (loss_mat.shape[-1] if norm_length is None else norm_length)
    return masked_mean(per_sequence, lengths > 0)
