"""Per-token log-probs and entropy from vocabulary-parallel logits, without gathering the vocabulary.

Each tensor-parallel rank holds logits for a contiguous slice of the (padded) vocabulary. The softmax
statistics are combined with two small all-reduces over the TP group (a max, then one sum of three
[tokens] vectors), so no rank ever materialises full-vocabulary logits. Megatron pads the vocabulary to a
multiple of 128 * tp; the padding columns are dropped before any statistic, so the results equal those of
the unpadded Hugging Face model (and of the rollout engine).

The backward pass is written by hand: it saves only the local logits (like Megatron's
vocab_parallel_cross_entropy) and recomputes the probabilities, instead of autograd keeping several
[tokens, vocab/tp] intermediates alive per micro-batch.
"""

import torch
import torch.distributed as dist


def _compute_dtype(logits: torch.Tensor) -> torch.Tensor:
    """float32 for half-precision logits; float32/float64 logits as they are (no copy)."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


class _LogprobEntropy(torch.autograd.Function):
    """(local logits [..., V/tp], targets [...]) -> (log p(target) [...], entropy [...]) in float32 (float64
    for float64 logits). group=None: a single rank holds the whole vocabulary (no all-reduce)."""

    @staticmethod
    def forward(ctx, local_logits, target, vocab_start, real_columns, group):
        logits = _compute_dtype(local_logits[..., :real_columns])
        lead = logits.shape[:-1]
        if real_columns > 0:
            local_max = logits.max(dim=-1).values
        else:  # every column of this rank is padding
            local_max = torch.full(lead, float("-inf"), dtype=logits.dtype, device=logits.device)
        global_max = local_max.clone()
        if group is not None:
            dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - global_max.unsqueeze(-1)
        exp = shifted.exp()
        in_slice = (target >= vocab_start) & (target < vocab_start + real_columns)
        column = (target - vocab_start).clamp(0, max(real_columns - 1, 0))
        if real_columns > 0:
            target_logit = shifted.gather(-1, column.unsqueeze(-1)).squeeze(-1) * in_slice
        else:
            target_logit = torch.zeros(lead, dtype=logits.dtype, device=logits.device)
        # One all-reduce for the three partial sums: sum exp, sum exp * logit, the target's logit.
        sums = torch.stack([exp.sum(-1), (exp * shifted).sum(-1), target_logit])
        if group is not None:
            dist.all_reduce(sums, group=group)
        sum_exp, sum_exp_logit, target_logit = sums
        log_sum_exp = sum_exp.log()
        mean_logit = sum_exp_logit / sum_exp  # E_p[logit - max]
        ctx.save_for_backward(local_logits, global_max, log_sum_exp, mean_logit, in_slice, column)
        ctx.real_columns = real_columns
        return target_logit - log_sum_exp, log_sum_exp - mean_logit

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        local_logits, global_max, log_sum_exp, mean_logit, in_slice, column = ctx.saved_tensors
        real = ctx.real_columns
        grad = torch.zeros(local_logits.shape, dtype=log_sum_exp.dtype, device=local_logits.device)
        if real > 0:
            shifted = _compute_dtype(local_logits[..., :real]) - global_max.unsqueeze(-1)
            probs = (shifted - log_sum_exp.unsqueeze(-1)).exp()
            # d logp/dz_j = 1[j = target] - p_j;  d H/dz_j = -p_j (z_j - E_p[z])
            local = -probs * (
                grad_logprob.unsqueeze(-1) + grad_entropy.unsqueeze(-1) * (shifted - mean_logit.unsqueeze(-1))
            )
            local.scatter_add_(-1, column.unsqueeze(-1), (grad_logprob * in_slice).unsqueeze(-1))
            grad[..., :real] = local
        # Every TP rank holds the same (replicated) loss, so its local columns' gradient needs no reduce.
        return grad.to(local_logits.dtype), None, None, None, None


def logprobs_and_entropy(
    local_logits: torch.Tensor, targets: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(targets) and the entropy of the next-token distribution at every position (float32).

    local_logits: this TP rank's [..., padded_vocab / tp] slice (Megatron's vocab-parallel output layer);
    targets: [...] global token ids in [0, vocab_size). Differentiable in local_logits (both outputs).
    """
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    local = local_logits.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * local
    real_columns = max(0, min(local, vocab_size - start))
    group = ps.get_tensor_model_parallel_group() if tp > 1 else None
    return _LogprobEntropy.apply(local_logits, targets, start, real_columns, group)


def shift_to_token_positions(per_position: torch.Tensor) -> torch.Tensor:
    """[B, S] values computed at position t for token t + 1 -> aligned with the token: out[:, t + 1].

    Position 0 (no preceding context) gets 0; the last position's value (it predicts past the end) is dropped.
    """
    return torch.cat([per_position.new_zeros(per_position.shape[0], 1), per_position[:, :-1]], dim=1)
