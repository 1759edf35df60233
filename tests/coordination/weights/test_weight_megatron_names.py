"""global_name (distflow/coordination/weights/megatron_names.py): a chunk's parameter names with layers and routed
experts numbered globally, against hand-written names."""

import pytest

from distflow.coordination.weights.megatron_names import global_name


@pytest.mark.parametrize(
    "local,offset,first_expert,expected",
    [
        (
            "decoder.layers.0.self_attention.linear_qkv.weight",
            4,
            0,
            "decoder.layers.4.self_attention.linear_qkv.weight",
        ),
        ("decoder.layers.3.mlp.linear_fc1.weight", 0, 0, "decoder.layers.3.mlp.linear_fc1.weight"),
        (
            "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight",
            6,
            8,
            "decoder.layers.7.mlp.experts.local_experts.10.linear_fc2.weight",
        ),
        (
            "decoder.layers.1.mlp.router.weight",
            6,
            8,
            "decoder.layers.7.mlp.router.weight",
        ),  # the router is no expert
        ("embedding.word_embeddings.weight", 6, 8, "embedding.word_embeddings.weight"),
        ("decoder.final_layernorm.weight", 6, 0, "decoder.final_layernorm.weight"),
        ("output_layer.weight", 6, 0, "output_layer.weight"),
    ],
)
def test_layers_and_experts_are_numbered_globally(local, offset, first_expert, expected):
    assert global_name(local, offset, first_expert) == expected
