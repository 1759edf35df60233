"""Llama (LlamaForCausalLM): the plain dense decoder every other family here varies from.

Llama 3.1+ "llama3" rope scaling is not mapped yet (DenseFamilySpec.check_supported rejects it).
"""
from distflow.models.spec import DenseFamilySpec

SPEC = DenseFamilySpec(family="llama", hf_architecture="LlamaForCausalLM")
