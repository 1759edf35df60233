"""Qwen2 / Qwen2.5 (Qwen2ForCausalLM): Llama plus biases on the q/k/v projections.

Small Qwen2 checkpoints tie the output layer to the embedding (tie_word_embeddings), read from the config.
"""

from distflow.models.spec import DenseFamilySpec

SPEC = DenseFamilySpec(family="qwen2", hf_architecture="Qwen2ForCausalLM", qkv_bias=True, sglang_shards=True)
