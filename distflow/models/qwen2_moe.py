"""Qwen1.5-MoE / Qwen2-MoE (Qwen2MoeForCausalLM): Qwen2 attention (q/k/v biases), routed experts plus a
shared expert gated by sigmoid(shared_expert_gate(x)); top-k weights not renormalised unless norm_topk_prob.
"""

from distflow.models.moe import MoEFamilySpec

SPEC = MoEFamilySpec(
    family="qwen2_moe",
    hf_architecture="Qwen2MoeForCausalLM",
    qkv_bias=True,
    shared_expert=True,
    sglang_shards=True,
)
