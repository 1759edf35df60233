"""The MoE block of a model inside a running SGLang engine, per engine TP rank (pure; no SGLang import).

Mixtral, Qwen2-MoE and Qwen3-MoE share SGLang's FusedMoE module. With the engine's default expert layout
(moe_tp_size = engine TP, no expert parallelism: every engine rank holds every expert, each expert's FFN
split over the ranks like a dense MLP), engine TP rank r of tp holds, per layer, under `{block}` = the HF
MoE block name (Mixtral: `block_sparse_moe`, else `mlp`); f = expert FFN width / tp:
- `{block}.experts.w13_weight` [experts, 2*f, hidden]: per expert cat(rows r*f.. of its gate projection,
  the same rows of its up projection) (Mixtral: w1, w3);
- `{block}.experts.w2_weight` [experts, hidden, f]: per expert columns r*f.. of its down projection (w2);
- `{block}.gate.weight` (the router) [experts, hidden], replicated;
- Qwen2-MoE's shared expert: `mlp.shared_expert.gate_up_proj/down_proj` split like a dense MLP, and
  `mlp.shared_expert_gate.weight` [1, hidden] replicated.
Names and shapes were read from running CPU engines (engine_side.probe) of tiny models of each family at
engine TP 1 and 2; the resharder compares them with the engine's again at the first sync. Expert segments
write one expert's slice of the stacked tensor: their destination region has one more leading dimension
(the expert, length 1) than their HF source region (plan.py lines the two up).
Not covered: SGLang's expert parallelism (--ep-size > 1: each engine rank would hold a subset of the experts)
and GPU backends that re-lay w13 out after loading (SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED, AMX packing, aiter
shuffles); the first sync's layout check fails on a shape difference, not on such a permutation.
"""

from distflow.coordination.weights.sglang_layout import Segment, TargetSpec, full, gated_mlp_targets
from distflow.models.moe import num_experts
from distflow.models.spec import as_config_dict


def moe_block_targets(spec, hf_config, engine_tp: int, rank: int, layer: int) -> list[TargetSpec]:
    """The MoE block's parameters of decoder layer `layer` on engine TP rank `rank` of `engine_tp`."""
    assert spec.moe, f"{spec.family} has no MoE block"
    cfg = as_config_dict(hf_config)
    hidden, experts = cfg["hidden_size"], num_experts(cfg)
    ffn = cfg[spec.hf_expert_ffn_key]
    if ffn % engine_tp:
        raise ValueError(f"{spec.hf_expert_ffn_key}={ffn} does not split over engine_tp={engine_tp}")
    f = ffn // engine_tp
    prefix = f"model.layers.{layer}.{spec.hf_moe_block}."
    gate, up, down = spec.hf_expert_projections

    def expert(e, projection):
        return f"{prefix}experts.{e}.{projection}.weight"

    w13, w2 = [], []
    for e in range(experts):
        for half, projection in enumerate((gate, up)):
            w13.append(
                Segment(
                    expert(e, projection), ((rank * f, f), (0, hidden)), ((e, 1), (half * f, f), (0, hidden))
                )
            )
        w2.append(Segment(expert(e, down), ((0, hidden), (rank * f, f)), ((e, 1), (0, hidden), (0, f))))
    out = [
        full(prefix + "gate.weight", (experts, hidden)),
        TargetSpec(prefix + "experts.w13_weight", (experts, 2 * f, hidden), tuple(w13)),
        TargetSpec(prefix + "experts.w2_weight", (experts, hidden, f), tuple(w2)),
    ]
    if spec.shared_expert:
        shared = prefix + "shared_expert."
        out += gated_mlp_targets(
            shared, shared, cfg["shared_expert_intermediate_size"], hidden, engine_tp, rank
        )
        out.append(full(prefix + "shared_expert_gate.weight", (1, hidden)))
    return out
