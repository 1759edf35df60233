"""What a mixture-of-experts decoder family is in Megatron-Core terms (Mixtral, Qwen2-MoE, Qwen3-MoE).

A `MoEFamilySpec` is a DenseFamilySpec whose MLP is Megatron's MoELayer: a TopKRouter, SequentialMLP
experts (`mlp.experts.local_experts.{e}`, the local spec with moe_grouped_gemm=False) and, for Qwen2-MoE,
a shared expert with a sigmoid gate (`mlp.shared_experts`, moe_shared_expert_gate=True). The families
differ only in data: where HF keeps the block, what it calls the expert projections and config keys, and
whether the top-k routing weights are renormalised. Routing is set so that Megatron picks the same experts
with the same weights as HF:
- renormalised top-k (Mixtral always, Qwen*-MoE with norm_topk_prob=True): HF takes softmax over all
  experts, the top k, and divides by their sum, which equals a softmax over the k largest logits:
  Megatron's moe_router_pre_softmax=False;
- plain top-k (norm_topk_prob=False): softmax over all experts, then top k, no renormalisation:
  moe_router_pre_softmax=True.
"""

from dataclasses import dataclass
from typing import ClassVar

from distflow.models.spec import DenseFamilySpec, as_config_dict

NUM_EXPERTS_KEYS = ("num_local_experts", "num_experts")
"""Mixtral's key, then Qwen-MoE's (transformers 5 also writes Mixtral's name for Qwen3-MoE)."""


@dataclass(frozen=True)
class MoEFamilySpec(DenseFamilySpec):
    """A DenseFamilySpec whose every decoder layer has a routed-experts MLP (optionally a shared expert)."""

    hf_moe_block: str = "mlp"
    """The MoE block's module name in a released checkpoint: "mlp", or "block_sparse_moe" (Mixtral)."""
    hf_expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    """Names of one expert's (gate, up, down) projections: Mixtral's are ("w1", "w3", "w2")."""
    hf_expert_ffn_key: str = "moe_intermediate_size"
    """Config key of one expert's FFN width (Mixtral: "intermediate_size")."""
    hf_norm_topk_key: str | None = "norm_topk_prob"
    """Config key that turns on renormalising the top-k weights; None: the family always renormalises."""
    hf_norm_topk_default: bool = False
    """Its value when the config lacks it (the transformers config class default)."""
    shared_expert: bool = False
    """A shared expert (`shared_expert`) whose output is scaled by sigmoid(`shared_expert_gate`(x))."""
    moe: ClassVar[bool] = True

    def transformer_config_kwargs(self, hf_config, **parallel) -> dict:
        """DenseFamilySpec's kwargs plus the MoE ones; parallel may set expert parallelism and dispatcher."""
        cfg = as_config_dict(hf_config)
        moe_kwargs = dict(
            num_moe_experts=num_experts(cfg),
            moe_router_topk=cfg["num_experts_per_tok"],
            moe_ffn_hidden_size=cfg[self.hf_expert_ffn_key],
            moe_router_pre_softmax=not self.renormalises_topk(cfg),
            moe_router_score_function="softmax",
            moe_grouped_gemm=False,
        )
        if self.shared_expert:
            moe_kwargs.update(
                moe_shared_expert_intermediate_size=cfg["shared_expert_intermediate_size"],
                moe_shared_expert_gate=True,
            )
        overlap = set(moe_kwargs) & set(parallel)
        assert not overlap, f"{sorted(overlap)} come from the HF config, not from the parallel settings"
        return {**super().transformer_config_kwargs(cfg, **parallel), **moe_kwargs}

    def layer_spec(self, hf_config, use_transformer_engine: bool = False):
        """The local spec with SequentialMLP experts on CPU. On GPU the TE spec, still with SequentialMLP
        (moe_grouped_gemm=False) so that expert parameter names stay `local_experts.{e}.linear_fc*`."""
        from megatron.core.models.gpt import gpt_layer_specs

        experts = num_experts(as_config_dict(hf_config))
        if use_transformer_engine:
            return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
                num_experts=experts, moe_grouped_gemm=False, qk_layernorm=self.qk_layernorm
            )
        return gpt_layer_specs.get_gpt_layer_local_spec(
            num_experts=experts,
            moe_grouped_gemm=False,
            qk_layernorm=self.qk_layernorm,
            normalization="RMSNorm",
        )

    def renormalises_topk(self, cfg: dict) -> bool:
        if self.hf_norm_topk_key is None:
            return True
        return bool(cfg.get(self.hf_norm_topk_key, self.hf_norm_topk_default))

    def check_supported(self, cfg: dict) -> None:
        super().check_supported(cfg)
        assert num_experts(cfg) > 0, (
            f"{self.family}: the config names no experts ({' / '.join(NUM_EXPERTS_KEYS)})"
        )
        # Qwen-MoE can interleave dense MLP layers (Megatron: moe_layer_freq); no released checkpoint does.
        dense_layers = cfg.get("mlp_only_layers") or []
        step = cfg.get("decoder_sparse_step", 1)
        assert not dense_layers and step == 1, (
            f"{self.family}: dense MLP layers (mlp_only_layers={dense_layers}, decoder_sparse_step={step}) "
            "are not mapped; every layer must be a MoE layer"
        )
        # Mixtral's jitter scales the experts' input too, Megatron's moe_input_jitter_eps only the router's.
        assert not cfg.get("router_jitter_noise"), f"{self.family}: router_jitter_noise is not mapped"


def num_experts(cfg: dict) -> int:
    """The number of routed experts in a HF config (0 when it names none)."""
    return int(next((cfg[k] for k in NUM_EXPERTS_KEYS if cfg.get(k)), 0))
