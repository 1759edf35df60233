"""Qwen3 (Qwen3ForCausalLM): Llama plus a per-head RMSNorm on queries and keys, and an explicit head_dim
that need not equal hidden_size / num_attention_heads (it becomes Megatron's kv_channels).
"""

from distflow.models.spec import DenseFamilySpec

SPEC = DenseFamilySpec(
    family="qwen3", hf_architecture="Qwen3ForCausalLM", qk_layernorm=True, sglang_shards=True
)
