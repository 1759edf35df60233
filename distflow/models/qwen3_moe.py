"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3 attention (q/k norms, explicit head_dim), routed experts without a
shared expert; released checkpoints set norm_topk_prob=True (renormalised top-k weights).
"""

from distflow.models.moe import MoEFamilySpec

SPEC = MoEFamilySpec(
    family="qwen3_moe", hf_architecture="Qwen3MoeForCausalLM", qk_layernorm=True, sglang_shards=True
)
