"""Parameter counts of a decoder model, whole and per GPU shard, from its Hugging Face config.json.

The architecture facts (q/k/v biases, q/k norms, shared experts, expert FFN key) come from the model
family spec (distflow.models.registry), so the planner counts what Megatron and SGLang will build. The
counts follow Megatron-Core's GPTModel: per layer an attention block (linear_qkv, linear_proj, two norms)
and an MLP (SwiGLU: fc1 = [gate; up], fc2) or a MoE block (router, routed experts, optional shared
expert); word embeddings on the first pipeline stage, the output layer on the last (also there when the
embeddings are tied and pp > 1: Megatron keeps a copy on the last stage), vocabulary padded for TP.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from distflow.layout.model_shape import ModelShape
from distflow.models.moe import num_experts
from distflow.models.registry import spec_for
from distflow.models.tp_sharding import padded_vocab_size


@dataclass(frozen=True)
class ModelArch:
    """The numbers of a decoder model that memory, KV-cache and weight-sync estimates need."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    """Dense MLP width (unused when every layer is a MoE layer)."""
    vocab_size: int
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    moe_top_k: int = 0
    shared_expert_ffn_hidden_size: int = 0
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    architecture: Optional[str] = None
    unsupported: Optional[str] = None
    """Why DistFlow's family spec would refuse this checkpoint today (None: it maps it)."""

    @classmethod
    def from_hf_config(cls, cfg: dict, source: str = "config.json") -> "ModelArch":
        """Reads a config.json dict; fails when no family spec handles its architecture."""
        try:
            spec = spec_for(cfg)
        except AssertionError as err:
            raise ValueError(f"{source}: {err}") from None
        unsupported = None
        try:
            spec.check_supported(cfg)
        except AssertionError as err:
            unsupported = str(err)
        shape = ModelShape.from_hf_config(cfg, source)
        experts = num_experts(cfg)
        return cls(
            num_layers=shape.num_layers,
            hidden_size=shape.hidden_size,
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads,
            head_dim=int(cfg.get("head_dim") or shape.hidden_size // shape.num_heads),
            ffn_hidden_size=int(cfg.get("intermediate_size") or 0),
            vocab_size=shape.vocab_size,
            num_experts=experts,
            moe_ffn_hidden_size=int(cfg.get(spec.hf_expert_ffn_key, 0)) if experts else 0,
            moe_top_k=int(cfg.get("num_experts_per_tok", 0)) if experts else 0,
            shared_expert_ffn_hidden_size=int(cfg.get("shared_expert_intermediate_size", 0))
            if getattr(spec, "shared_expert", False)
            else 0,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=spec.qkv_bias,
            qk_norm=spec.qk_layernorm,
            architecture=shape.architecture,
            unsupported=unsupported,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelArch":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such model config (a HF config.json or a model directory)")
        return cls.from_hf_config(json.loads(path.read_text()), str(path))

    def shape(self) -> ModelShape:
        """The subset that parallel layouts are validated against."""
        return ModelShape(
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
            num_experts=self.num_experts,
            architecture=self.architecture,
        )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # ---- parameter counts of one decoder layer, split by how they are sharded ----
    @property
    def attention_params(self) -> int:
        """linear_qkv (+ bias) and linear_proj: split over TP."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return h * (q + 2 * kv) + q * h + ((q + 2 * kv) if self.qkv_bias else 0)

    @property
    def kv_params(self) -> int:
        """The K and V rows of linear_qkv in one layer (SGLang replicates them when engine_tp > KV heads)."""
        kv = self.num_kv_heads * self.head_dim
        return 2 * kv * self.hidden_size + (2 * kv if self.qkv_bias else 0)

    @property
    def dense_mlp_params(self) -> int:
        """A dense layer's SwiGLU MLP, or a MoE layer's shared expert: split over TP."""
        width = self.shared_expert_ffn_hidden_size if self.is_moe else self.ffn_hidden_size
        return 3 * self.hidden_size * width

    @property
    def expert_params(self) -> int:
        """All routed experts of one layer: split over EP (whole experts) and ETP (within an expert)."""
        return self.num_experts * 3 * self.hidden_size * self.moe_ffn_hidden_size

    @property
    def replicated_params(self) -> int:
        """Norms, q/k norms, the router and the shared-expert gate: every TP rank holds all of them."""
        h = self.hidden_size
        extra = 2 * self.head_dim if self.qk_norm else 0
        if self.is_moe:
            extra += h * self.num_experts + (h if self.shared_expert_ffn_hidden_size else 0)
        return 2 * h + extra

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.dense_mlp_params + self.expert_params + self.replicated_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """The Hugging Face model's parameter count (unpadded vocabulary)."""
        output = 0 if self.tie_embeddings else self.embedding_params
        return self.num_layers * self.layer_params + self.embedding_params + output + self.hidden_size

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (MoE: top-k experts of each layer)."""
        if not self.is_moe:
            return self.total_params
        inactive = (self.num_experts - self.moe_top_k) * 3 * self.hidden_size * self.moe_ffn_hidden_size
        return self.total_params - self.num_layers * inactive

    def describe(self) -> str:
        kind = (
            f"MoE, {self.num_experts} experts top-{self.moe_top_k}, {self.active_params / 1e9:.2f} B active"
            if self.is_moe
            else "dense"
        )
        return (
            f"{self.architecture}: {self.total_params / 1e9:.2f} B parameters ({kind}), {self.num_layers} layers, "
            f"hidden {self.hidden_size}, {self.num_heads} heads / {self.num_kv_heads} KV heads x {self.head_dim}, "
            f"vocab {self.vocab_size}" + (", tied embeddings" if self.tie_embeddings else "")
        )


@dataclass(frozen=True)
class ShardParams:
    """Parameters one GPU holds for a Megatron role on one pipeline stage."""

    dense: float
    """Non-expert parameters (sharded over TP, replicated over DP x CP)."""
    expert: float
    """Routed-expert parameters (sharded over EP x ETP, replicated over the expert-DP ranks)."""

    @property
    def total(self) -> float:
        return self.dense + self.expert


def padded_vocab(vocab_size: int, tp: int) -> int:
    return padded_vocab_size(vocab_size, tp)


def megatron_shard_params(
    arch: ModelArch,
    tp: int,
    pp: int,
    ep: int,
    etp: int,
    stage: int,
    value_head: bool = False,
    vocab_padding: bool = True,
) -> ShardParams:
    """Parameters that pipeline stage `stage` (0-based) of a Megatron layout puts on each of its GPUs.

    value_head: the critic, whose output layer is a 1-wide value head instead of the vocabulary.
    vocab_padding: False counts the HF (unpadded) vocabulary, as a weight sync sends it.
    """
    layers = arch.num_layers / pp
    dense = layers * ((arch.attention_params + arch.dense_mlp_params) / tp + arch.replicated_params)
    vocab = (padded_vocab(arch.vocab_size, tp) if vocab_padding else arch.vocab_size) * arch.hidden_size / tp
    if stage == 0:
        dense += vocab
    if stage == pp - 1:
        dense += arch.hidden_size  # final norm
        if value_head:
            dense += arch.hidden_size
        elif not (arch.tie_embeddings and pp == 1):  # tied at pp=1: the embedding is the output layer
            dense += vocab
    expert = layers * arch.expert_params / (ep * etp)
    return ShardParams(dense=dense, expert=expert)


def engine_params_per_gpu(arch: ModelArch, engine_tp: int) -> float:
    """Parameters one GPU of an SGLang engine holds: everything split over engine_tp, except that KV heads
    are replicated when engine_tp exceeds them (SGLang keeps max(1, kv_heads / tp) heads per rank)."""
    kv_heads_per_gpu = max(1, arch.num_kv_heads // engine_tp)
    kv_share = kv_heads_per_gpu / arch.num_kv_heads  # fraction of the K/V rows one GPU holds
    kv_total = arch.num_layers * arch.kv_params
    return (arch.total_params - kv_total) / engine_tp + kv_total * kv_share
