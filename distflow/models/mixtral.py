"""Mixtral (MixtralForCausalLM): Llama attention, every MLP a top-k mixture of SwiGLU experts.

Released checkpoints keep the block as `block_sparse_moe` with experts `w1` (gate), `w3` (up), `w2` (down)
and router `gate`; the top-k routing weights are always renormalised (no config key).
"""

from distflow.models.moe import MoEFamilySpec

SPEC = MoEFamilySpec(
    family="mixtral",
    hf_architecture="MixtralForCausalLM",
    hf_moe_block="block_sparse_moe",
    hf_expert_projections=("w1", "w3", "w2"),
    hf_expert_ffn_key="intermediate_size",
    hf_norm_topk_key=None,
    sglang_shards=True,
)
