"""Per-GPU memory estimates: Megatron model states, activations, and the SGLang engine's KV cache.

Pure functions of (model architecture, layout, config numbers); every estimate is a formula written
down here, so a plan can be checked by hand. Bytes throughout; the report prints GiB.

Model states (Megatron mixed precision, as distflow.workers.megatron.builder sets it up): bf16 weights
(2 B/param), fp32 gradient buffers (4 B, grad_reduce_in_fp32), and the optimizer's fp32 master weights
plus Adam m and v (12 B), which the distributed optimizer shards over the data-parallel ranks (dense
parameters over DP x CP, expert parameters over the expert-DP ranks). fp32 training keeps no separate
master copy (8 B of Adam states). A forward-only role (the reference) holds weights only.

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
re-derived for the layers DistFlow trains: RMSNorm, grouped-query attention, SwiGLU or MoE MLP, no
dropout, flash attention): per token and layer the backward pass keeps, in 2-byte elements,
    4h                   inputs of the two norms and of linear_qkv / linear_fc1   (/tp with sequence parallel)
    (a + 2g)d + ad       q, k, v and the attention output (linear_proj's input)  (/tp)
    3f                   fc1's output [gate; up] and fc2's input                  (/tp)
    MoE instead of 3f:   top_k * (etp * h + 3 f_e) for the routed copies of the rank's tokens (balanced
                         routing; an ETP group gathers its ranks' tokens and splits f_e) + 2E for the
                         fp32 router logits, /tp with sequence parallel (the dispatcher routes each TP
                         rank's token slice); + 3 f_s / tp for a shared expert
    a * s                the softmax of unfused attention only (s = sequence length; /tp); flash
                         attention (Transformer Engine, DistFlow's GPU spec) never stores it, and
                         selective recompute (Megatron's core_attn) drops it too
With multi-head attention (g = a, a*d = h) and a GeLU MLP's 8h in place of 3f this is 16h elements =
32 bytes per token: the paper's 34sbh minus its 2sbh of dropout masks.
Full recompute keeps only each recompute chunk's input (2h bytes per token, /tp with SP) plus one
chunk's activations while it is recomputed. A pipeline stage holds L/pp layers for every micro-batch in
flight: 1F1B keeps min(pp, micro-batches) on the first stage; the interleaved schedule multiplies that by
(1 + (pp - 1) / (pp * vpp)). The last stage also keeps the logits: bf16 plus the fp32 copy the log-prob
and entropy computation makes, 6 bytes per (token, vocabulary entry / tp).
"""

import math
from dataclasses import dataclass
from typing import Optional

from distflow.plan.model_size import ModelArch, ShardParams

GiB = 2**30
ACT_BYTES = 2  # bf16 activations
LOGIT_BYTES = 2 + 4  # bf16 logits + their fp32 copy in the log-prob / entropy computation
KV_BYTES = 2  # bf16 KV cache


@dataclass(frozen=True)
class BytesPerParam:
    weight: int
    grad: int
    optimizer: int
    """fp32 master + Adam m, v (12) in mixed precision; Adam m, v only (8) in fp32."""


def bytes_per_param(dtype: str) -> BytesPerParam:
    if dtype == "float32":
        return BytesPerParam(weight=4, grad=4, optimizer=8)
    return BytesPerParam(weight=2, grad=4, optimizer=12)


@dataclass(frozen=True)
class ModelStates:
    weights: float
    grads: float
    optimizer: float
    optimizer_unsharded: float
    """What the optimizer states would take without the distributed optimizer."""

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def model_state_bytes(
    params: ShardParams,
    dtype: str,
    trains: bool,
    distributed_optimizer: bool,
    dense_dp: int,
    expert_dp: int,
    cpu_offload_fraction: float = 0.0,
) -> ModelStates:
    """Weights, gradients and optimizer states on one GPU holding `params`.

    dense_dp / expert_dp: the ranks the distributed optimizer shards dense / expert states over
    (DP x CP, and world / (pp x ep x etp)). cpu_offload_fraction: the share of the optimizer states
    Megatron's HybridDeviceOptimizer keeps in CPU memory (optimizer_cpu_offload, optimizer_offload_fraction).
    """
    b = bytes_per_param(dtype)
    if not trains:
        return ModelStates(weights=params.total * b.weight, grads=0.0, optimizer=0.0, optimizer_unsharded=0.0)
    unsharded = params.total * b.optimizer
    sharded = params.dense * b.optimizer / dense_dp + params.expert * b.optimizer / expert_dp
    on_gpu = (sharded if distributed_optimizer else unsharded) * (1.0 - cpu_offload_fraction)
    return ModelStates(
        weights=params.total * b.weight,
        grads=params.total * b.grad,
        optimizer=on_gpu,
        optimizer_unsharded=unsharded,
    )


def optimizer_cpu_offload_fraction(optim) -> float:
    """The share of the optimizer states an OptimizerConfig section offloads to CPU (0: none), as Megatron
    reads optim.megatron: optimizer_cpu_offload on, optimizer_offload_fraction (Megatron's default 0.0)."""
    extra = optim.megatron or {}
    if not extra.get("optimizer_cpu_offload"):
        return 0.0
    return float(extra.get("optimizer_offload_fraction", 0.0))


def layer_activation_elements(
    arch: ModelArch, tp: int, sequence_parallel: bool, etp: int = 1, seq_len: Optional[int] = None
) -> float:
    """2-byte elements one transformer layer keeps per token for backward, without recompute.

    seq_len: given for unfused attention (adds the a*s softmax term); None for flash attention.
    """
    h, d = arch.hidden_size, arch.head_dim
    a, g = arch.num_heads, arch.num_kv_heads
    norm_and_inputs = 4 * h / (tp if sequence_parallel else 1)
    attention = ((a + 2 * g) * d + a * d) / tp
    if seq_len is not None:
        attention += a * seq_len / tp
    if arch.is_moe:
        routed = arch.moe_top_k * (etp * h + 3 * arch.moe_ffn_hidden_size) + 2 * arch.num_experts
        mlp = routed / (tp if sequence_parallel else 1) + 3 * arch.shared_expert_ffn_hidden_size / tp
    else:
        mlp = 3 * arch.ffn_hidden_size / tp
    return norm_and_inputs + attention + mlp


@dataclass(frozen=True)
class Activations:
    per_layer: float
    """Bytes one layer keeps for one micro-batch without recompute."""
    stored_per_microbatch: float
    """Bytes a stage keeps per micro-batch in flight after recompute (layers of the stage)."""
    in_flight: float
    """Micro-batches in flight on this stage (1F1B / interleaved)."""
    recompute_working: float
    """One recompute chunk's activations, rebuilt during backward (0 without full recompute)."""
    logits: float
    total: float


def activation_bytes(
    arch: ModelArch,
    *,
    tokens: int,
    tp: int,
    pp: int,
    vpp: int,
    cp: int,
    etp: int,
    sequence_parallel: bool,
    recompute: Optional[str],
    recompute_method: Optional[str],
    recompute_num_layers: Optional[int],
    micro_batches: int,
    stage: int,
    padded_vocab: int,
    value_head: bool = False,
    seq_len: Optional[int] = None,
) -> Activations:
    """Activation bytes of pipeline stage `stage` while training (see the module docstring).

    tokens: tokens of one micro-batch (its token budget, or micro_batch_size x sequence length); each CP
    rank holds tokens / cp. micro_batches: micro-batches of one optimizer step on this DP rank.
    seq_len: the longest sequence, for unfused attention's softmax; None with flash attention.
    """
    local_tokens = tokens / cp
    softmax_len = None if recompute == "selective" else seq_len  # selective recompute: core attention
    per_layer = (
        ACT_BYTES * local_tokens * layer_activation_elements(arch, tp, sequence_parallel, etp, softmax_len)
    )
    layers = arch.num_layers // pp
    layer_input = ACT_BYTES * local_tokens * arch.hidden_size / (tp if sequence_parallel else 1)
    working = 0.0
    if recompute == "full":
        chunk = max(1, min(recompute_num_layers or 1, layers))
        if recompute_method == "block":  # the first `chunk` layers recompute, the rest store everything
            stored = chunk * layer_input + (layers - chunk) * per_layer
            working = per_layer
        else:  # uniform: layers in chunks of `chunk`, each chunk keeps only its input
            stored = math.ceil(layers / chunk) * layer_input
            working = chunk * per_layer
    else:
        stored = layers * per_layer
    in_flight = float(min(pp - stage, micro_batches))
    if vpp > 1 and stage == 0:
        in_flight *= 1 + (pp - 1) / (pp * vpp)
    logits = 0.0
    if stage == pp - 1 and not value_head:
        logits = LOGIT_BYTES * local_tokens * padded_vocab / tp
    return Activations(
        per_layer=per_layer,
        stored_per_microbatch=stored,
        in_flight=in_flight,
        recompute_working=working,
        logits=logits,
        total=stored * in_flight + working + logits,
    )


def kv_bytes_per_token(arch: ModelArch, engine_tp: int) -> int:
    """KV-cache bytes one token takes on one engine GPU (K and V of every layer, its KV heads)."""
    return 2 * arch.num_layers * max(1, arch.num_kv_heads // engine_tp) * arch.head_dim * KV_BYTES


@dataclass(frozen=True)
class EngineMemory:
    weights: float
    kv_cache: float
    """The KV pool; negative when the weights alone do not fit the engine's share."""
    kv_tokens: int
    static_total: float
    """weights + KV pool = mem_fraction_static x the free memory at engine start."""


def engine_memory(
    gpu_bytes: float,
    mem_fraction_static: float,
    weight_bytes: float,
    resident_bytes: float,
    kv_per_token: int,
) -> EngineMemory:
    """SGLang's sizing: at start it measures the free memory F (the GPU minus what is already resident,
    e.g. the colocated Megatron states), loads its weights W, and takes the KV pool as what is then free
    minus a slack of F x (1 - mem_fraction_static):  KV = mem_fraction_static x F - W.
    (sglang/srt/mem_cache/kv_cache_configurator.py, _profile_available_bytes, SGLang 0.5.23.)"""
    free = gpu_bytes - resident_bytes
    kv = mem_fraction_static * free - weight_bytes
    return EngineMemory(
        weights=weight_bytes,
        kv_cache=kv,
        kv_tokens=max(0, int(kv // kv_per_token)),
        static_total=mem_fraction_static * free,
    )
