"""The pure HF <-> Megatron mapping: layouts by hand, round trips, TP shards, stage offsets, registry."""

import pytest
import torch

from distflow.models import tp_sharding, weight_mapping
from distflow.models.conversion import (
    HFCheckpoint,
    hf_to_megatron_shard,
    megatron_full_to_hf,
    megatron_shards_to_full,
)
from distflow.models.registry import DENSE_FAMILIES, SPECS, spec_for


def test_qkv_interleave_matches_megatron_group_layout():
    # 4 query heads in 2 groups, head_dim 1: rows are labelled by head so the layout is readable.
    q, k, v = (
        torch.tensor([[0.0], [1.0], [2.0], [3.0]]),
        torch.tensor([[10.0], [11.0]]),
        torch.tensor([[20.0], [21.0]]),
    )
    qkv = weight_mapping.interleave_qkv(q, k, v, heads=4, groups=2, head_dim=1)
    assert qkv.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    assert all(torch.equal(a, b) for a, b in zip(weight_mapping.split_qkv(qkv, 4, 2, 1), (q, k, v)))


def test_gated_fc1_shards_hold_their_own_gate_and_up_rows():
    full = torch.arange(8.0).reshape(8, 1)  # gate rows 0..3, up rows 4..7
    shards = [tp_sharding.shard("decoder.layers.0.mlp.linear_fc1.weight", full, r, 2) for r in range(2)]
    assert [s.flatten().tolist() for s in shards] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert torch.equal(tp_sharding.unshard("decoder.layers.0.mlp.linear_fc1.weight", shards), full)


def test_padded_vocab_size_follows_megatron():
    assert tp_sharding.padded_vocab_size(512, 1) == 512
    assert tp_sharding.padded_vocab_size(151936, 1) == 151936
    assert tp_sharding.padded_vocab_size(151936, 2) == 152064
    assert tp_sharding.padded_vocab_size(32000, 8) == 32768


@pytest.mark.parametrize("family", DENSE_FAMILIES)
def test_hf_to_megatron_to_hf_is_identity(tiny_model_dirs, family):
    ckpt = HFCheckpoint(tiny_model_dirs[family])
    spec = spec_for(ckpt.config)
    assert spec.family == family
    full = hf_to_megatron_shard(spec, ckpt.config, ckpt.get)
    back = megatron_full_to_hf(spec, ckpt.config, full)
    assert sorted(back) == ckpt.names()
    assert all(torch.equal(back[name], ckpt.get(name)) for name in back)


@pytest.mark.parametrize("family", DENSE_FAMILIES)
@pytest.mark.parametrize("tp_size", [2, 4])
def test_tp_shards_reassemble_to_the_full_state(tiny_model_dirs, family, tp_size):
    ckpt = HFCheckpoint(tiny_model_dirs[family])
    spec, vocab = spec_for(ckpt.config), ckpt.config["vocab_size"]
    full = hf_to_megatron_shard(spec, ckpt.config, ckpt.get)
    shards = [
        hf_to_megatron_shard(spec, ckpt.config, ckpt.get, tp_rank=r, tp_size=tp_size) for r in range(tp_size)
    ]
    padded = tp_sharding.padded_vocab_size(vocab, tp_size)
    assert shards[0]["embedding.word_embeddings.weight"].shape[0] == padded // tp_size
    qkv = shards[0]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape[0] == full["decoder.layers.0.self_attention.linear_qkv.weight"].shape[0] // tp_size
    gathered = megatron_shards_to_full(shards, vocab)
    assert gathered.keys() == full.keys()
    assert all(torch.equal(gathered[n], full[n]) for n in full)


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # tied and untied output layer
def test_pipeline_stages_cover_the_model_once(tiny_model_dirs, family):
    ckpt = HFCheckpoint(tiny_model_dirs[family])
    spec = spec_for(ckpt.config)
    first = hf_to_megatron_shard(
        spec, ckpt.config, ckpt.get, layer_offset=0, num_layers=1, post_process=False
    )
    last = hf_to_megatron_shard(spec, ckpt.config, ckpt.get, layer_offset=1, num_layers=1, pre_process=False)
    assert "decoder.layers.1.input_layernorm.weight" not in last, "stage layer indices are local"
    assert torch.equal(
        last["decoder.layers.0.mlp.linear_fc2.weight"], ckpt.get("model.layers.1.mlp.down_proj.weight")
    )
    # A tied model's last stage has its own output layer, made from the embedding, that HF does not store.
    assert ("output_layer.weight" in last) and torch.equal(
        last["output_layer.weight"],
        ckpt.get("lm_head.weight" if family == "llama" else "model.embed_tokens.weight"),
    )
    back = {
        **megatron_full_to_hf(spec, ckpt.config, first, layer_offset=0),
        **megatron_full_to_hf(spec, ckpt.config, last, layer_offset=1),
    }
    assert sorted(back) == ckpt.names()
    assert all(torch.equal(back[n], ckpt.get(n)) for n in back)


def test_registry_and_transformer_config(tiny_model_dirs):
    from megatron.core.transformer import TransformerConfig

    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"} <= set(SPECS)
    with pytest.raises(AssertionError, match="supported"):
        spec_for({"architectures": ["GPT2LMHeadModel"]})
    qwen3 = HFCheckpoint(tiny_model_dirs["qwen3"]).config
    config = TransformerConfig(
        **spec_for(qwen3).transformer_config_kwargs(qwen3, tensor_model_parallel_size=1)
    )
    assert (config.kv_channels, config.num_query_groups, config.qk_layernorm) == (qwen3["head_dim"], 2, True)
    assert config.normalization == "RMSNorm" and config.gated_linear_unit and not config.add_bias_linear
    qwen2 = HFCheckpoint(tiny_model_dirs["qwen2"]).config
    fields = spec_for(qwen2).gpt_model_fields(qwen2, tp_size=2)
    assert fields["tie_embeddings"] and fields["vocab_size"] == 512 and fields["rotary_base"] == 10000.0
    assert spec_for(qwen2).transformer_config_kwargs(qwen2)["add_qkv_bias"]
    with pytest.raises(AssertionError, match="sliding-window"):
        spec_for({"architectures": ["MistralForCausalLM"]}).check_supported({"sliding_window": 4096})


def test_one_local_expert_pattern_for_full_names_and_layer_suffixes():
    LOCAL_EXPERT = tp_sharding.LOCAL_EXPERT
    full = LOCAL_EXPERT.search("decoder.layers.1.mlp.experts.local_experts.12.linear_fc1.weight")
    assert full.group(1) == "12" and full.start(1) == len("decoder.layers.1.mlp.experts.local_experts.")
    assert LOCAL_EXPERT.match("mlp.experts.local_experts.3.linear_fc2.weight").group(1) == "3"
    assert LOCAL_EXPERT.search("decoder.layers.1.mlp.shared_experts.linear_fc1.weight") is None
    assert LOCAL_EXPERT.search("decoder.layers.1.xmlp.experts.local_experts.0.linear_fc1.weight") is None
