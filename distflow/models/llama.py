"""Llama (LlamaForCausalLM): the plain dense decoder every other family here varies from.

Llama 3.1+ "llama3" rope scaling maps to GPTModel(rope_scaling=True, rope_scaling_factor=factor); see
spec.check_rope_scaling for the values Megatron-Core can reproduce.
"""

from distflow.models.spec import DenseFamilySpec

SPEC = DenseFamilySpec(family="llama", hf_architecture="LlamaForCausalLM", sglang_shards=True)
