"""Time of Megatron's passes over a step's tokens: FLOPs / achieved FLOP/s, the pipeline bubble of pp/vpp,
the TP all-reduces of each layer and the data-parallel gradient reduction.

FLOPs per token (the usual dense-transformer count, e.g. Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters"): a forward pass costs 2 x active parameters plus the attention
scores and values, 2 x 2 x layers x (heads x head_dim) x context / 2 (causal: half the context on average);
backward costs twice the forward; full recompute adds one more forward.
"""

from dataclasses import dataclass

from distflow.plan.model_size import ModelArch


def forward_flops_per_token(arch: ModelArch, context: float) -> float:
    attention = 2 * 2 * arch.num_layers * arch.num_heads * arch.head_dim * context / 2
    return 2 * arch.active_params + attention


def pipeline_bubble(pp: int, vpp: int, micro_batches: int) -> float:
    """Idle fraction added by 1F1B with interleaving: (pp - 1) / (vpp x micro-batches)."""
    return (pp - 1) / (max(1, vpp) * max(1, micro_batches)) if pp > 1 else 0.0


@dataclass(frozen=True)
class PassTime:
    compute_s: float
    bubble_s: float
    tp_comm_s: float
    dp_comm_s: float

    @property
    def seconds(self) -> float:
        return self.compute_s + self.bubble_s + self.tp_comm_s + self.dp_comm_s


def pass_time(
    arch: ModelArch,
    tokens_per_dp: float,
    context: float,
    model_parallel: int,
    flops_s: float,
    mfu: float,
    *,
    backward: bool,
    recompute: bool,
    pp: int = 1,
    vpp: int = 1,
    micro_batches: int = 1,
    tp: int = 1,
    tp_bandwidth: float = 0.0,
    tp_latency: float = 0.0,
    grad_bytes_per_rank: float = 0.0,
    dp: int = 1,
    dp_bandwidth: float = 0.0,
    dp_latency: float = 0.0,
    optimizer_steps: int = 1,
) -> PassTime:
    """One pass (forward only, or forward + backward) over tokens_per_dp tokens on one DP rank's
    model_parallel GPUs (tp x pp x cp). TP comm: sequence-parallel all-gather + reduce-scatter around
    attention and MLP, 2 per layer forward (4 more backward) of tokens x hidden bf16 activations;
    DP comm: a ring reduce-scatter + all-gather of the rank's gradients per optimizer step."""
    per_token = forward_flops_per_token(arch, context) * ((3 + (1 if recompute else 0)) if backward else 1)
    compute = tokens_per_dp * per_token / (model_parallel * flops_s * mfu)
    bubble = compute * pipeline_bubble(pp, vpp, micro_batches)
    tp_comm = 0.0
    if tp > 1 and tp_bandwidth:
        passes = (2 + 4 + (2 if recompute else 0)) if backward else 2
        layers = arch.num_layers / pp
        volume = tokens_per_dp * arch.hidden_size * 2 * (tp - 1) / tp
        tp_comm = passes * layers * (volume / tp_bandwidth + micro_batches * tp_latency)
    dp_comm = 0.0
    if backward and dp > 1 and dp_bandwidth:
        dp_comm = optimizer_steps * (
            2 * grad_bytes_per_rank * (dp - 1) / dp / dp_bandwidth + 2 * (dp - 1) * dp_latency
        )
    return PassTime(compute, bubble, tp_comm, dp_comm)
