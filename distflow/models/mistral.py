"""Mistral (MistralForCausalLM): the Llama layout; checkpoints with sliding-window attention (v0.1) are
rejected until the window is mapped to Megatron's window_size and checked against HF.
"""

from distflow.models.spec import DenseFamilySpec

SPEC = DenseFamilySpec(family="mistral", hf_architecture="MistralForCausalLM", sglang_shards=True)
