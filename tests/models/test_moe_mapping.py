"""The MoE families' pure mapping: specs and routing config, expert rules, EP/ETP shards, fused expert files."""

import pytest
import torch
from safetensors.torch import save_file

from distflow.models import expert_layout, tp_sharding
from distflow.models.conversion import (
    HFCheckpoint,
    hf_to_megatron_shard,
    megatron_full_to_hf,
    megatron_shards_to_full,
    merge_expert_parallel,
)
from distflow.models.registry import MOE_FAMILIES, SPECS, spec_for

FC1 = "decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc1.weight"


def test_registry_lists_the_moe_families():
    assert MOE_FAMILIES == ("mixtral", "qwen2_moe", "qwen3_moe")
    assert {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"} <= set(SPECS)
    with pytest.raises(AssertionError, match="supported"):
        spec_for({"architectures": ["DeepseekV3ForCausalLM"]})


@pytest.mark.parametrize(
    "family, pre_softmax, shared",
    [("mixtral", False, None), ("qwen2_moe", True, 128), ("qwen3_moe", False, None)],
)
def test_transformer_config_routes_like_hf(tiny_model_dirs, family, pre_softmax, shared):
    from megatron.core.transformer import TransformerConfig

    cfg = HFCheckpoint(tiny_model_dirs[family]).config
    spec = spec_for(cfg)
    config = TransformerConfig(
        **spec.transformer_config_kwargs(cfg, tensor_model_parallel_size=1, expert_model_parallel_size=2)
    )
    # Mixtral and norm_topk_prob=True renormalise the top k (= softmax over the top-k logits); Qwen2-MoE
    # (norm_topk_prob=False) keeps the softmax over all experts.
    assert config.moe_router_pre_softmax is pre_softmax and config.moe_router_score_function == "softmax"
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == (4, 2, 128)
    assert config.moe_shared_expert_intermediate_size == shared
    assert config.moe_shared_expert_gate is (shared is not None)
    assert config.expert_model_parallel_size == 2 and not config.moe_grouped_gemm
    assert config.qk_layernorm is (family == "qwen3_moe") and config.add_qkv_bias is (family == "qwen2_moe")


def test_unmapped_moe_features_are_rejected():
    qwen2_moe = SPECS["Qwen2MoeForCausalLM"]
    with pytest.raises(AssertionError, match="mlp_only_layers"):
        qwen2_moe.check_supported({"num_experts": 4, "mlp_only_layers": [0]})
    with pytest.raises(AssertionError, match="jitter"):
        SPECS["MixtralForCausalLM"].check_supported({"num_local_experts": 4, "router_jitter_noise": 0.1})


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_hf_to_megatron_to_hf_is_identity(tiny_model_dirs, family):
    ckpt = HFCheckpoint(tiny_model_dirs[family])
    spec = spec_for(ckpt.config)
    full = hf_to_megatron_shard(spec, ckpt.config, ckpt.get)
    assert torch.equal(
        full["decoder.layers.1.mlp.router.weight"],
        ckpt.get(f"model.layers.1.{spec.hf_moe_block}.gate.weight"),
    )
    gate, up, down = spec.hf_expert_projections
    expert = f"model.layers.0.{spec.hf_moe_block}.experts.3"
    assert torch.equal(
        full[FC1.format(layer=0, e=3)],
        torch.cat([ckpt.get(f"{expert}.{gate}.weight"), ckpt.get(f"{expert}.{up}.weight")]),
    )
    assert ("decoder.layers.0.mlp.shared_experts.gate_weight" in full) is spec.shared_expert
    back = megatron_full_to_hf(spec, ckpt.config, full)
    assert sorted(back) == ckpt.names()
    assert all(torch.equal(back[name], ckpt.get(name)) for name in back)


@pytest.mark.parametrize("tp_size, etp_size", [(1, 1), (2, 2), (2, 1)])
def test_expert_parallel_shards_hold_contiguous_experts(tiny_model_dirs, tp_size, etp_size):
    ckpt = HFCheckpoint(tiny_model_dirs["qwen2_moe"])
    spec, cfg = spec_for(ckpt.config), ckpt.config
    full = hf_to_megatron_shard(spec, cfg, ckpt.get)
    ep_size = 2
    shards = {
        (ep, tp): hf_to_megatron_shard(
            spec,
            cfg,
            ckpt.get,
            tp_rank=tp,
            tp_size=tp_size,
            ep_rank=ep,
            ep_size=ep_size,
            etp_rank=tp % etp_size,
            etp_size=etp_size,
        )
        for ep in range(ep_size)
        for tp in range(tp_size)
    }
    # EP rank 1 holds global experts 2 and 3 as its local experts 0 and 1, split over ETP only.
    rank1 = shards[(1, 0)][FC1.format(layer=0, e=1)]
    assert rank1.shape[0] == full[FC1.format(layer=0, e=3)].shape[0] // etp_size
    assert FC1.format(layer=0, e=2) not in shards[(1, 0)]
    shared = shards[(0, 0)]["decoder.layers.0.mlp.shared_experts.linear_fc1.weight"]
    assert (
        shared.shape[0] == full["decoder.layers.0.mlp.shared_experts.linear_fc1.weight"].shape[0] // tp_size
    )
    per_ep = []
    for ep in range(ep_size):
        dense = megatron_shards_to_full([shards[(ep, tp)] for tp in range(tp_size)], cfg["vocab_size"])
        experts = megatron_shards_to_full([shards[(ep, tp)] for tp in range(etp_size)], cfg["vocab_size"])
        per_ep.append({n: experts[n] if tp_sharding.is_expert_param(n) else t for n, t in dense.items()})
    merged = merge_expert_parallel(per_ep)
    assert merged.keys() == full.keys()
    assert all(torch.equal(merged[n], full[n]) for n in full)


@pytest.fixture(scope="module")
def fused_dirs(tiny_model_dirs, tmp_path_factory) -> dict:
    """The tiny MoE models re-saved by transformers in its fused in-memory layout."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("fused")
    for family in MOE_FAMILIES:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs[family], dtype=torch.float32)
        model.save_pretrained(root / family, save_original_format=False)
    return {family: root / family for family in MOE_FAMILIES}


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_fused_expert_files_read_as_the_released_layout(tiny_model_dirs, fused_dirs, family):
    per_expert, fused = HFCheckpoint(tiny_model_dirs[family]), HFCheckpoint(fused_dirs[family])
    assert (per_expert.expert_layout, fused.expert_layout) == (expert_layout.PER_EXPERT, expert_layout.FUSED)
    assert fused.names() == per_expert.names()
    assert all(
        fused.shape(n) == per_expert.shape(n) and torch.equal(fused.get(n), per_expert.get(n))
        for n in per_expert.names()
    )
    # and back: fusing the canonical tensors gives the file transformers wrote
    spec = spec_for(fused.config)
    refused = expert_layout.fuse_layer(spec, {n: per_expert.get(n) for n in per_expert.names()})
    from safetensors import safe_open

    with safe_open(fused_dirs[family] / "model.safetensors", "pt") as f:
        assert sorted(refused) == sorted(f.keys())
        assert all(torch.equal(refused[n], f.get_tensor(n)) for n in refused)


def test_fused_reader_slices_one_expert(tmp_path):
    """Expert e's gate/up/down are rows [e, :ffn], [e, ffn:] of gate_up_proj and [e] of down_proj."""
    gate_up = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)  # 2 experts, ffn 2, hidden 3
    down = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    save_file(
        {
            "model.layers.0.mlp.experts.gate_up_proj": gate_up,
            "model.layers.0.mlp.experts.down_proj": down,
            "model.layers.0.mlp.gate.weight": torch.zeros(2, 3),
        },
        tmp_path / "model.safetensors",
    )
    (tmp_path / "config.json").write_text('{"architectures": ["MixtralForCausalLM"]}')
    ckpt = HFCheckpoint(tmp_path)
    assert torch.equal(ckpt.get("model.layers.0.block_sparse_moe.experts.1.w1.weight"), gate_up[1, :2])
    assert torch.equal(ckpt.get("model.layers.0.block_sparse_moe.experts.1.w3.weight"), gate_up[1, 2:])
    assert torch.equal(ckpt.get("model.layers.0.block_sparse_moe.experts.0.w2.weight"), down[0])
    assert ckpt.shape("model.layers.0.block_sparse_moe.experts.0.w1.weight") == (2, 3)
    assert "model.layers.0.block_sparse_moe.gate.weight" in ckpt.names()
