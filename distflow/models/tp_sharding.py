"""How each Megatron GPTModel (local spec) parameter is split over tensor-parallel ranks.

"Full" tensors are the TP=1 model's, with the HF vocabulary unpadded. A rank's shard is what its own
GPTModel holds, so `shard(...)` lets a rank build its parameters without ever materialising another rank's,
and `unshard(...)` inverts it for gathering. The layouts follow Megatron's modules:
- column-parallel (ColumnParallelLinear): rows split contiguously. linear_qkv's rows are stored per query
  group [q heads of group 0, k0, v0, q heads of group 1, ...], so a contiguous split gives each rank whole
  groups (or, with more ranks than groups, Megatron's own slice of one group);
- gated column-parallel (linear_fc1 = [gate; up]): each rank holds [its gate rows; its up rows], because
  the SwiGLU splits the rank's local output in halves;
- row-parallel (linear_proj, linear_fc2): columns split contiguously;
- vocab-parallel (word embeddings, output layer): rows padded to padded_vocab_size, then split;
- replicated: norms (RMSNorm weights, q/k layernorms), the MoE router and the shared-expert gate.
MoE experts (`mlp.experts.local_experts.{e}.linear_fc1/fc2`) follow the same rules over the expert
tensor-parallel group (ETP) instead of TP; a shared expert is an ordinary TP MLP.
"""

import re

import torch

COLUMN, GATED_COLUMN, ROW, VOCAB, REPLICATED = "column", "gated_column", "row", "vocab", "replicated"

_LAYOUT_BY_SUFFIX = {
    "self_attention.linear_qkv.weight": COLUMN,
    "self_attention.linear_qkv.bias": COLUMN,
    "self_attention.linear_proj.weight": ROW,
    "linear_fc1.weight": GATED_COLUMN,  # mlp., experts' and shared experts' alike
    "linear_fc2.weight": ROW,
    "embedding.word_embeddings.weight": VOCAB,
    "output_layer.weight": VOCAB,
    "mlp.router.weight": REPLICATED,
    "mlp.shared_experts.gate_weight": REPLICATED,
}


LOCAL_EXPERT = re.compile(r"(?:^|\.)mlp\.experts\.local_experts\.(\d+)\.")
"""A routed expert's parameter in a Megatron name (SequentialMLP), whole or from its layer's `mlp.` on: group 1
is the expert's index on its EP rank. The one definition; conversion, export and the weight sync read it."""


def is_expert_param(megatron_name: str) -> bool:
    """Routed-expert parameters: split over the expert tensor-parallel group, distributed over EP."""
    return ".mlp.experts." in megatron_name


def padded_vocab_size(vocab_size: int, tp_size: int, divisible_by: int = 128) -> int:
    """Megatron's make_vocab_size_divisible_by rule: round up to a multiple of divisible_by * tp_size."""
    multiple = divisible_by * tp_size
    return -(-vocab_size // multiple) * multiple


def tp_layout(megatron_name: str) -> str:
    """One of COLUMN, GATED_COLUMN, ROW, VOCAB, REPLICATED for a GPTModel parameter name."""
    for suffix, layout in _LAYOUT_BY_SUFFIX.items():
        if megatron_name.endswith(suffix):
            return layout
    assert megatron_name.endswith("norm.weight"), f"no TP layout known for {megatron_name!r}"
    return REPLICATED


def shard(
    megatron_name: str, full: torch.Tensor, tp_rank: int, tp_size: int, padded_vocab: int | None = None
) -> torch.Tensor:
    """This rank's part of a full tensor. VOCAB tensors need padded_vocab (zero rows are appended)."""
    layout = tp_layout(megatron_name)
    if layout == REPLICATED:
        return full
    if layout == VOCAB:
        assert padded_vocab is not None and padded_vocab >= full.shape[0], (
            f"{megatron_name}: padded_vocab={padded_vocab} must be given and >= vocab {full.shape[0]}"
        )
        full = torch.cat([full, full.new_zeros(padded_vocab - full.shape[0], *full.shape[1:])])
    if layout == GATED_COLUMN:
        gate, up = full.chunk(2, dim=0)
        return torch.cat(
            [_split(megatron_name, gate, 0, tp_size)[tp_rank], _split(megatron_name, up, 0, tp_size)[tp_rank]]
        )
    return _split(megatron_name, full, 1 if layout == ROW else 0, tp_size)[tp_rank].clone()


def unshard(megatron_name: str, shards: list[torch.Tensor], vocab_size: int | None = None) -> torch.Tensor:
    """The full tensor from every rank's shard, in rank order. VOCAB tensors are cut back to vocab_size."""
    layout = tp_layout(megatron_name)
    if layout == REPLICATED:
        return shards[0]
    if layout == GATED_COLUMN:
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    full = torch.cat(shards, dim=1 if layout == ROW else 0)
    if layout == VOCAB:
        assert vocab_size is not None, f"{megatron_name}: vocab_size is needed to drop the padding rows"
        full = full[:vocab_size]
    return full


def _split(name: str, tensor: torch.Tensor, dim: int, parts: int) -> tuple:
    assert tensor.shape[dim] % parts == 0, (
        f"{name}: dim {dim} of {tuple(tensor.shape)} not divisible by TP {parts}"
    )
    return tensor.chunk(parts, dim=dim)
