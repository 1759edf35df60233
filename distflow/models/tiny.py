"""Tiny Hugging Face models of real architectures, with seeded random weights and a locally trained tokenizer.

Tests, CI and CPU rollouts need real model directories (config.json, model.safetensors, tokenizer files)
that load in transformers, SGLang and our Megatron conversion, without any download. `make_tiny_model`
writes one; the same family, sizes and seed always give the same files.
"""

import json
import math
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig

from distflow.config.dtypes import torch_dtype
from distflow.models.tiny_tokenizer import PAD_TOKEN, train_tiny_tokenizer

# family -> (config class name, architecture). Names, not classes, so that importing this module is cheap.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")
DEFAULT_SIZES = dict(
    layers=2,
    hidden=64,
    heads=4,
    kv_heads=2,
    ffn=128,
    experts=4,
    top_k=2,
    vocab=512,
    head_dim=None,
    seed=0,
    dtype="float32",
)
ROPE_THETA = 10000.0
ROPE_VARIANTS = {
    "default": {"rope_type": "default", "rope_theta": ROPE_THETA},
    # Llama 3.1's published rope settings (meta-llama/Llama-3.1-8B config.json), its rope_theta included:
    # with head_dim 16, one frequency pair falls in the smoothed band and three in the factor-8 band, and a
    # sequence of a few hundred tokens rotates them far enough that unscaled rope gives visibly other logits.
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
"""make_tiny_model's `rope` choices: the rope_parameters written to config.json."""


def make_tiny_model(family: str, out_dir, rope: str = "default", tool_calls: bool = False, **sizes) -> Path:
    """Writes a tiny `family` model directory to `out_dir` and returns its path.

    sizes (all optional, see DEFAULT_SIZES): layers, hidden, heads, kv_heads, ffn (dense FFN and each
    expert's width), experts, top_k, vocab (tokenizer and embedding size), head_dim (default hidden/heads,
    except Qwen3 families: 2*hidden/heads, so that head_dim != hidden/heads is exercised as in real Qwen3),
    seed, dtype ("float32" | "bfloat16" | "float16").
    rope: a ROPE_VARIANTS key; "llama3" makes a Llama-3.1-style config (rope scaling, 128K positions).
    tool_calls: the tokenizer also learns Hermes tool calls (a ~20-token call instead of ~70 bytes), as a
    real chat model's would; for multi-turn tool tasks (examples/configs/grpo_lookup_cpu.yaml).
    """
    assert family in FAMILIES, f"unknown family {family!r}; choose one of {sorted(FAMILIES)}"
    assert rope in ROPE_VARIANTS, f"unknown rope {rope!r}; choose one of {sorted(ROPE_VARIANTS)}"
    unknown = set(sizes) - set(DEFAULT_SIZES)
    assert not unknown, f"unknown size arguments {sorted(unknown)}; known: {sorted(DEFAULT_SIZES)}"
    s = {**DEFAULT_SIZES, **sizes}
    assert s["hidden"] % s["heads"] == 0 and s["heads"] % s["kv_heads"] == 0, f"inconsistent heads: {s}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tiny_tokenizer(s["vocab"], seed=s["seed"], tool_calls=tool_calls)
    assert len(tokenizer) <= s["vocab"], f"tokenizer has {len(tokenizer)} tokens > vocab {s['vocab']}"
    token_ids = dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = _hf_config(family, s, token_ids, rope)

    torch.manual_seed(s["seed"])  # anything _fill_weights does not reach (none today) is still seeded
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _fill_weights(model, s["seed"])
    model.to(torch_dtype(s["dtype"]))
    # Chat models stop at the end of the turn; base-model text stops at end-of-text.
    model.generation_config = GenerationConfig(
        bos_token_id=token_ids["bos_token_id"],
        pad_token_id=token_ids["pad_token_id"],
        eos_token_id=[token_ids["eos_token_id"], tokenizer.convert_tokens_to_ids(PAD_TOKEN)],
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _add_legacy_config_keys(out / "config.json", family)
    return out


def _hf_config(family: str, s: dict, token_ids: dict, rope: str = "default"):
    config_cls_name, architecture = FAMILIES[family]
    head_dim = s["head_dim"] or (2 if family.startswith("qwen3") else 1) * s["hidden"] // s["heads"]
    common = dict(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        # Llama 3.1 extends the 8K context it was trained at to 128K (HF wants original < max).
        max_position_embeddings=131072 if rope == "llama3" else 2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters=dict(ROPE_VARIANTS[rope]),
        architectures=[architecture],
        **token_ids,
    )
    moe = dict(num_experts_per_tok=s["top_k"])
    per_family = {
        "llama": dict(head_dim=head_dim, attention_bias=False, mlp_bias=False),
        # Qwen2 always has q/k/v biases; small Qwen2 checkpoints tie the output layer to the embedding.
        "qwen2": dict(tie_word_embeddings=True, use_sliding_window=False),
        "qwen3": dict(head_dim=head_dim, attention_bias=False, use_sliding_window=False),
        "mistral": dict(head_dim=head_dim, sliding_window=None),
        "mixtral": dict(head_dim=head_dim, sliding_window=None, num_local_experts=s["experts"], **moe),
        "qwen2_moe": dict(
            num_experts=s["experts"],
            moe_intermediate_size=s["ffn"],
            qkv_bias=True,
            shared_expert_intermediate_size=s["ffn"],
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            use_sliding_window=False,
            **moe,
        ),
        "qwen3_moe": dict(
            head_dim=head_dim,
            num_experts=s["experts"],
            moe_intermediate_size=s["ffn"],
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            attention_bias=False,
            use_sliding_window=False,
            **moe,
        ),
    }[family]
    return getattr(transformers, config_cls_name)(**{**common, **per_family})


@torch.no_grad()
def _fill_weights(model: torch.nn.Module, seed: int) -> None:
    """Overwrites every parameter from one generator, in name order, independent of HF's init code.

    Scales keep activations and logits of order one (std 1/sqrt(fan_in)), so that outputs are far from
    uniform and a conversion error shows up as a large logit difference. Norm weights are 1 + noise, not
    ones, so that a norm mapped to the wrong place is caught too.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if param.dim() >= 2:
            value = noise / math.sqrt(param.shape[-1])
        elif name.endswith("bias"):
            value = 0.1 * noise
        else:
            value = 1.0 + 0.1 * noise
        param.copy_(value)


def _add_legacy_config_keys(config_path: Path, family: str) -> None:
    """Adds the key names that released checkpoints use (older transformers and other readers expect them).

    transformers 5 writes `rope_parameters` and, for Qwen3-MoE, `num_local_experts`; hub checkpoints have
    `rope_theta` and `num_experts`. transformers 5 reads either.
    """
    cfg = json.loads(config_path.read_text())
    cfg.setdefault("rope_theta", cfg["rope_parameters"]["rope_theta"])
    if family in ("qwen2_moe", "qwen3_moe"):
        cfg["num_experts"] = cfg.pop("num_local_experts", cfg.get("num_experts"))
    config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
