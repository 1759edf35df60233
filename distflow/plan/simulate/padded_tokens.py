"""The tokens a Megatron pass computes: one data-parallel rank's rows cut into mini-batches and micro-batches
as the worker cuts them (workers/megatron/worker.py, _micro_batches), each micro-batch padded to its own
longest row (rounded up to the TP size under sequence parallelism), or every micro-batch to one shape where
the pipeline stages exchange no shapes. The README main job's 256 rows (a 19-token prompt and 1-7 response
tokens) fit one micro-batch of the 8192-token budget: 256 x 26 = 6,656 tokens computed for ~6,140 real."""

from dataclasses import dataclass

import numpy as np

from distflow.workers.megatron import batching
from distflow.workers.megatron.builder import shapes_exchange_unsafe

# DP ranks whose rows are cut (evenly spread over them): their lengths are alike, and the token-budget cut
# of every rank of a 1024-GPU sweep would take seconds
SAMPLED_DP_RANKS = 8


@dataclass(frozen=True)
class PaddedPass:
    tokens: int
    """Tokens the busiest DP rank's pass computes, padding included (one epoch)."""
    micro_batches: int
    """Micro-batches of its largest mini-batch (the pipeline schedule's count)."""


def padded_pass(
    lengths: np.ndarray, samples_per_prompt: int, dp: int, role_cfg, tp: int, pp: int, vpp: int, trains: bool
) -> PaddedPass:
    """`lengths`: every sample's prompt + response tokens, prompt-major (a prompt's samples together, as the
    data coordinator keeps them on one DP rank); prompt groups are dealt to the DP ranks in turn.
    role_cfg: the role's MegatronRoleConfig (micro-batching, mini_batch_size, sequence_parallel)."""
    groups = np.asarray(lengths).reshape(-1, samples_per_prompt)
    sampled = min(dp, SAMPLED_DP_RANKS)
    ranks = sorted({round(i * (dp - 1) / max(1, sampled - 1)) for i in range(sampled)})
    rows_per_mini_batch = (
        (getattr(role_cfg, "mini_batch_size", 0) or 0) * samples_per_prompt // dp if trains else 0
    )
    multiple = pp if vpp > 1 else 1  # the interleaved schedule needs a multiple of pp micro-batches
    pad = tp if role_cfg.sequence_parallel else 1
    uniform = pp > 1 and shapes_exchange_unsafe(pp, vpp)  # one shape for every micro-batch
    busiest = PaddedPass(0, 1)
    for rank in ranks:
        rank_lengths = groups[rank::dp].reshape(-1).tolist()
        tokens, most = 0, 1
        for rows in batching.mini_batch_ranges(len(rank_lengths), rows_per_mini_batch):
            mini = rank_lengths[rows.start : rows.stop]
            cut = batching.row_groups(mini, role_cfg, multiple)
            most = max(most, len(cut))
            # each micro-batch's (rows, padded length), or one shape for all of them
            shapes = (
                [batching.uniform_shape(cut, mini, pad)] * len(cut)
                if uniform
                else [batching.uniform_shape([g], mini, pad) for g in cut]
            )
            tokens += sum(r * length for r, length in shapes)
        if tokens > busiest.tokens:
            busiest = PaddedPass(tokens, most)
    return busiest
