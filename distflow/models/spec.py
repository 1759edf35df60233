"""What a dense decoder family is in Megatron-Core terms: its TransformerConfig, layer spec and GPTModel args.

A `DenseFamilySpec` is the one description per Hugging Face architecture (see registry.py); the weight
name mapping (weight_mapping.py) and the TP layout (tp_sharding.py) read the same spec, so a family's
differences (qkv bias, q/k norm, head_dim) are written down once.
"""
from dataclasses import dataclass
from typing import ClassVar

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
    moe: ClassVar[bool] = False
    """Mixture-of-experts MLPs (moe.MoEFamilySpec); the weight mapping branches on it."""

    def transformer_config_kwargs(self, hf_config, **parallel) -> dict:
        """Keyword arguments for megatron.core TransformerConfig. `parallel` (TP/PP sizes, dtypes,
        use_cpu_initialization, ...) is added unchanged; it may not restate what the checkpoint decides.

        Dropout follows the checkpoint (0 for all supported families); fusions keep Megatron's defaults.
        """
        import torch.nn.functional as F

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

    def gpt_model_fields(self, hf_config, tp_size: int, make_vocab_size_divisible_by: int = 128,
                         use_transformer_engine: bool = False) -> dict:
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
        )

    def layer_spec(self, hf_config, use_transformer_engine: bool = False):
        """Megatron's local (pure PyTorch) layer spec on CPU, its Transformer Engine spec on GPU.

        The TE spec fuses the input/pre-MLP norms into linear_qkv/linear_fc1: see te_param_name().
        """
        from megatron.core.models.gpt import gpt_layer_specs

        if use_transformer_engine:
            return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=self.qk_layernorm)
        return gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=self.qk_layernorm, normalization="RMSNorm")

    def check_supported(self, cfg: dict) -> None:
        """Fails loudly on checkpoint features this spec would otherwise silently get wrong."""
        assert cfg.get("hidden_act", "silu") == "silu", f"{self.family}: only SwiGLU (silu) MLPs are mapped"
        assert not cfg.get("mlp_bias", False), f"{self.family}: MLP biases are not mapped"
        if not self.qkv_bias:
            assert not cfg.get("attention_bias", False), f"{self.family}: attention biases are not mapped"
        # TODO: Mistral's sliding window maps to TransformerConfig.window_size; not verified against HF yet.
        assert cfg.get("sliding_window") is None or not cfg.get("use_sliding_window", True), (
            f"{self.family}: sliding-window attention (sliding_window={cfg.get('sliding_window')}) is not mapped")
        rope_type = (cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}).get("rope_type", "default")
        # TODO: Llama 3.x "llama3" rope scaling maps to GPTModel(rope_scaling=True, rope_scaling_factor=...);
        # Megatron hard-codes the low/high frequency factors and original context, check them first.
        assert rope_type == "default", f"{self.family}: rope scaling {rope_type!r} is not mapped yet"


def rope_theta(cfg: dict) -> float:
    """The rotary base; transformers 5 nests it under rope_parameters, released checkpoints have it on top."""
    if "rope_theta" in cfg:
        return float(cfg["rope_theta"])
    return float((cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))


def as_config_dict(hf_config) -> dict:
    """Accepts a transformers config object or a config.json dict."""
    return hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
