"""Which families SGLang takes shards for is a field of the family spec, and the weight sync reads it there."""

import dataclasses

import pytest

from distflow.coordination.weights import plan as wplan
from distflow.coordination.weights.sglang_layout import SHARD_FAMILIES
from distflow.models.registry import SPECS

LLAMA = SPECS["LlamaForCausalLM"]


def test_every_supported_family_has_an_sglang_shard_layout():
    assert SHARD_FAMILIES == ("llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe", "qwen3_moe")
    assert all(spec.sglang_shards for spec in SPECS.values())


def test_a_family_without_it_syncs_hf_named_tensors():
    no_shards = dataclasses.replace(LLAMA, sglang_shards=False)
    assert wplan.sync_mode(LLAMA) == wplan.SHARDS
    assert wplan.sync_mode(no_shards) == wplan.HF
    with pytest.raises(ValueError, match="llama: no SGLang shard layout .*use mode 'hf'"):
        wplan.sync_mode(no_shards, "shards")
