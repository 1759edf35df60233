"""Token entropy of the policy's next-token distribution, from full-vocabulary logits.

The Megatron worker computes entropy vocab-parallel (each tensor-parallel rank holds a slice of the
vocabulary and the log-sum-exp is all-reduced); this single-device version is the reference its tests
compare against.
"""

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy H = logsumexp(z) - sum_v softmax(z)_v z_v of `logits` [..., vocab] -> [...], in float32 or wider.

    The log-sum-exp form never takes log(p) of an underflowed probability, so it stays finite for any finite
    logits (a naive -sum p log p gives 0 * -inf = NaN once some p underflows to 0).
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
