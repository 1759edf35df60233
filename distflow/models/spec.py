"""What a dense decoder family is in Megatron-Core terms: its TransformerConfig, layer spec and GPTModel args.

A `DenseFamilySpec` is the one description per Hugging Face architecture (see registry.py); the weight
name mapping (weight_mapping.py) and the TP layout (tp_sharding.py) read the same spec, so a family's
differences (qkv bias, q/k norm, head_dim) are written down once.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch.nn.functional as F

from distflow.models.tp_sharding import padded_vocab_size


@dataclass(frozen=True)
class DenseFamilySpec:
    """A Llama-like decoder: RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention, no linear bias."""

    family: str
    """Short name ("llama", "qwen2", ...), as tools/make_tiny_model.py --family spells it."""
    hf_architecture: str
    """`architectures[0]` of the Hugging Face config.json, e.g. "Qwen2ForCausalLM"."""
    qkv_bias: bool = False
    """q/k/v projections have biases (Qwen2) while every other linear layer has none."""
    qk_layernorm: bool = False
    """RMSNorm over each head's query and key before rotary embedding (Qwen3)."""
    sglang_shards: bool = False
    """SGLang's model for this family takes its own TP shards as coordination/weights/sglang_layout lays them out
    (Llama's fused qkv/gate_up; MoE: sglang_moe_layout's fused experts), so the weight sync can send each
    engine rank only its slice; False: the sync sends HF-named full tensors (mode "hf")."""
    moe: ClassVar[bool] = False
    """Mixture-of-experts MLPs (moe.MoEFamilySpec); the weight mapping branches on it."""

    def transformer_config_kwargs(self, hf_config, **parallel) -> dict:
        """Keyword arguments for megatron.core TransformerConfig. `parallel` (TP/PP sizes, dtypes,
        use_cpu_initialization, ...) is added unchanged; it may not restate what the checkpoint decides.

        Dropout follows the checkpoint (0 for all supported families); fusions keep Megatron's defaults.
        """
        cfg = as_config_dict(hf_config)
        self.check_supported(cfg)
        heads = cfg["num_attention_heads"]
        kwargs = dict(
            num_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            ffn_hidden_size=cfg["intermediate_size"],
            num_attention_heads=heads,
            num_query_groups=cfg.get("num_key_value_heads") or heads,
            # Qwen3 decouples head_dim from hidden_size / heads; None in older configs means the quotient.
            kv_channels=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            normalization="RMSNorm",
            layernorm_epsilon=cfg["rms_norm_eps"],
            gated_linear_unit=True,
            activation_func=F.silu,
            add_bias_linear=False,
            add_qkv_bias=self.qkv_bias,
            qk_layernorm=self.qk_layernorm,
            attention_dropout=cfg.get("attention_dropout", 0.0),
            hidden_dropout=0.0,
        )
        overlap = set(kwargs) & set(parallel)
        assert not overlap, f"{sorted(overlap)} come from the HF config, not from the parallel settings"
        return {**kwargs, **parallel}

    def gpt_model_fields(
        self,
        hf_config,
        tp_size: int,
        make_vocab_size_divisible_by: int = 128,
        use_transformer_engine: bool = False,
    ) -> dict:
        """What GPTModel needs beyond TransformerConfig (the fields of workers.megatron GPTBuildSpec).

        vocab_size is padded for TP as Megatron's training scripts do, so its rows split evenly; the
        padded logits must be ignored (sliced off) by whoever reads vocabulary-wide outputs.
        """
        cfg = as_config_dict(hf_config)
        self.check_supported(cfg)
        return dict(
            vocab_size=padded_vocab_size(cfg["vocab_size"], tp_size, make_vocab_size_divisible_by),
            max_sequence_length=cfg["max_position_embeddings"],
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rotary_base=rope_theta(cfg),
            layer_spec=self.layer_spec(cfg, use_transformer_engine),
            **rope_scaling_fields(cfg),
        )

    def layer_spec(self, hf_config, use_transformer_engine: bool = False):
        """Megatron's local (pure PyTorch) layer spec on CPU, its Transformer Engine spec on GPU.

        The TE spec fuses the input/pre-MLP norms into linear_qkv/linear_fc1: see te_param_name().
        """
        from megatron.core.models.gpt import gpt_layer_specs

        if use_transformer_engine:
            return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=self.qk_layernorm)
        return gpt_layer_specs.get_gpt_layer_local_spec(
            qk_layernorm=self.qk_layernorm, normalization="RMSNorm"
        )

    def check_supported(self, cfg: dict) -> None:
        """Fails loudly on checkpoint features this spec would otherwise silently get wrong."""
        assert cfg.get("hidden_act", "silu") == "silu", f"{self.family}: only SwiGLU (silu) MLPs are mapped"
        assert not cfg.get("mlp_bias", False), f"{self.family}: MLP biases are not mapped"
        if not self.qkv_bias:
            assert not cfg.get("attention_bias", False), f"{self.family}: attention biases are not mapped"
        # TODO: Mistral's sliding window maps to TransformerConfig.window_size; not verified against HF yet.
        assert cfg.get("sliding_window") is None or not cfg.get("use_sliding_window", True), (
            f"{self.family}: sliding-window attention (sliding_window={cfg.get('sliding_window')}) is not mapped"
        )
        check_rope_scaling(self.family, cfg)


SUPPORTED_ROPE_TYPES = ("default", "llama3")
"""HF rope types the families map: plain RoPE, and Llama 3.1's frequency-dependent scaling."""
MEGATRON_LLAMA3_FIXED = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
"""What megatron-core 0.16's RotaryEmbedding._apply_scaling hard-codes (GPTModel passes only `factor`);
every released Llama 3.1/3.2/3.3 checkpoint uses these values, with factor 8 (3.1, 3.3) or 32 (3.2)."""


def rope_parameters(cfg: dict) -> dict:
    """The rope settings of a config: released checkpoints write `rope_scaling` (None without scaling),
    transformers 5 writes `rope_parameters`; older configs spell the type `type`."""
    return dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})


def rope_type(cfg: dict) -> str:
    params = rope_parameters(cfg)
    return params.get("rope_type") or params.get("type") or "default"


def check_rope_scaling(family: str, cfg: dict) -> None:
    """Fails naming the field when the rope settings are ones Megatron's GPTModel cannot reproduce."""
    params, kind = rope_parameters(cfg), rope_type(cfg)
    assert kind in SUPPORTED_ROPE_TYPES, (
        f"{family}: rope scaling {kind!r} (config rope_scaling.rope_type) is not mapped; supported rope types: "
        f"{list(SUPPORTED_ROPE_TYPES)}"
    )
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    assert partial == 1.0, (
        f"{family}: partial_rotary_factor={partial} is not mapped; only 1.0 (rotate all dims)"
    )
    if kind != "llama3":
        return
    factor = params.get("factor")
    assert isinstance(factor, (int, float)) and factor >= 1, (
        f"{family}: rope_scaling.factor={factor!r} must be a number >= 1 for llama3 rope scaling"
    )
    for field, fixed in MEGATRON_LLAMA3_FIXED.items():
        assert params.get(field) == fixed, (
            f"{family}: rope_scaling.{field}={params.get(field)!r} is not supported: Megatron-Core's llama3 rope "
            f"scaling fixes {field} to {fixed} (supported: "
            + ", ".join(f"{k}={v}" for k, v in MEGATRON_LLAMA3_FIXED.items())
            + ", any factor >= 1)"
        )


def rope_scaling_fields(cfg: dict) -> dict:
    """GPTModel's rope_scaling / rope_scaling_factor for a config (check_rope_scaling must have passed)."""
    if rope_type(cfg) != "llama3":
        return dict(rope_scaling=False, rope_scaling_factor=8.0)
    return dict(rope_scaling=True, rope_scaling_factor=float(rope_parameters(cfg)["factor"]))


def rope_theta(cfg: dict) -> float:
    """The rotary base; transformers 5 nests it under rope_parameters, released checkpoints have it on top."""
    if "rope_theta" in cfg:
        return float(cfg["rope_theta"])
    return float((cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))


def as_config_dict(hf_config) -> dict:
    """Accepts a transformers config object or a config.json dict."""
    return hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
