"""Pure two-way mapping between Hugging Face parameter names/tensors and Megatron GPTModel (local spec) ones.

Works on full (TP=1) tensors with the HF vocabulary; tp_sharding.py splits them per rank. The Megatron
names were checked against `GPTModel(...).state_dict()` of megatron-core 0.16.1 (tests/models). Megatron
layer indices are local to a pipeline stage: global HF layer = layer_offset + local index. MoE layers
(spec.moe) map the router, each routed expert (`mlp.experts.local_experts.{e}`, local to an expert-parallel
rank: global expert = ep_rank * experts per rank + e) and the shared expert; HF names are those of
released checkpoints (per expert; expert_layout.py reads transformers' fused files as such).
"""

import re
from dataclasses import dataclass

import torch

from distflow.models.moe import num_experts
from distflow.models.spec import DenseFamilySpec, as_config_dict
from distflow.models.tp_sharding import LOCAL_EXPERT

COPY, QKV, GATE_UP = "copy", "qkv", "gate_up"

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class ParamRule:
    """One Megatron parameter and the HF tensors it is made of."""

    megatron: str
    hf: tuple[str, ...]
    kind: str = COPY
    """COPY (same tensor), QKV (q, k, v -> per-group interleave) or GATE_UP (cat(gate, up))."""
    exported: bool = True
    """False for the tied output layer of a last pipeline stage: HF stores it once, as the embedding."""


def layer_rules(
    spec: DenseFamilySpec, hf_config=None, *, ep_rank: int = 0, ep_size: int = 1
) -> list[tuple[str, tuple[str, ...], str]]:
    """(Megatron suffix, HF suffixes, kind) inside one decoder layer, for this family.

    MoE families need hf_config (the expert count); with expert parallelism a rank's layer holds only
    experts ep_rank * E/ep_size ... (ep_rank + 1) * E/ep_size - 1, as local experts 0, 1, ...
    """
    rules = [
        ("input_layernorm.weight", ("input_layernorm.weight",), COPY),
        (
            "self_attention.linear_qkv.weight",
            ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
            QKV,
        ),
        ("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), COPY),
        ("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), COPY),
    ]
    if spec.moe:
        rules += moe_mlp_rules(spec, as_config_dict(hf_config), ep_rank=ep_rank, ep_size=ep_size)
    else:
        rules += [
            ("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), GATE_UP),
            ("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), COPY),
        ]
    if spec.qkv_bias:
        rules.append(
            (
                "self_attention.linear_qkv.bias",
                ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
                QKV,
            )
        )
    if spec.qk_layernorm:
        rules += [
            ("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",), COPY),
            ("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",), COPY),
        ]
    return rules


def moe_mlp_rules(
    spec, cfg: dict, *, ep_rank: int = 0, ep_size: int = 1, experts: list[int] | None = None
) -> list[tuple[str, tuple[str, ...], str]]:
    """The MoE block's rules: router, this EP rank's experts (or the global `experts` given, numbered as
    in an EP=1 model) and the shared expert."""
    block = spec.hf_moe_block
    total = num_experts(cfg)
    assert total % ep_size == 0, (
        f"{spec.family}: {total} experts do not split over expert parallel size {ep_size}"
    )
    per_rank = total // ep_size
    if experts is None:
        pairs = [(ep_rank * per_rank + local, local) for local in range(per_rank)]
    else:
        pairs = [(e, e) for e in experts]
    gate, up, down = spec.hf_expert_projections
    rules = [("mlp.router.weight", (f"{block}.gate.weight",), COPY)]
    for global_e, local in pairs:
        hf = f"{block}.experts.{global_e}"
        rules += [
            (
                f"mlp.experts.local_experts.{local}.linear_fc1.weight",
                (f"{hf}.{gate}.weight", f"{hf}.{up}.weight"),
                GATE_UP,
            ),
            (f"mlp.experts.local_experts.{local}.linear_fc2.weight", (f"{hf}.{down}.weight",), COPY),
        ]
    if spec.shared_expert:
        rules += [
            (
                "mlp.shared_experts.linear_fc1.weight",
                (f"{block}.shared_expert.gate_proj.weight", f"{block}.shared_expert.up_proj.weight"),
                GATE_UP,
            ),
            ("mlp.shared_experts.linear_fc2.weight", (f"{block}.shared_expert.down_proj.weight",), COPY),
            ("mlp.shared_experts.gate_weight", (f"{block}.shared_expert_gate.weight",), COPY),
        ]
    return rules


def param_rules(
    spec: DenseFamilySpec,
    hf_config,
    *,
    layer_offset: int = 0,
    num_layers: int | None = None,
    pre_process: bool = True,
    post_process: bool = True,
    ep_rank: int = 0,
    ep_size: int = 1,
) -> list[ParamRule]:
    """Every parameter of one pipeline stage's GPTModel (layers layer_offset .. +num_layers), in order;
    MoE layers hold the experts of expert-parallel rank ep_rank of ep_size."""
    cfg = as_config_dict(hf_config)
    num_layers = cfg["num_hidden_layers"] - layer_offset if num_layers is None else num_layers
    tied = bool(cfg.get("tie_word_embeddings", False))
    rules = []
    if pre_process:
        rules.append(ParamRule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",)))
    for local in range(num_layers):
        for megatron_suffix, hf_suffixes, kind in layer_rules(spec, cfg, ep_rank=ep_rank, ep_size=ep_size):
            rules.append(
                ParamRule(
                    f"decoder.layers.{local}.{megatron_suffix}",
                    tuple(f"model.layers.{layer_offset + local}.{s}" for s in hf_suffixes),
                    kind,
                )
            )
    if post_process:
        rules.append(ParamRule("decoder.final_layernorm.weight", ("model.norm.weight",)))
        if not tied:
            rules.append(ParamRule("output_layer.weight", ("lm_head.weight",)))
        elif not pre_process:
            # A tied model's last stage still holds its own copy of the embedding as the output layer.
            rules.append(ParamRule("output_layer.weight", ("model.embed_tokens.weight",), exported=False))
    return rules


def rule_for(spec: DenseFamilySpec, hf_config, megatron_name: str, layer_offset: int = 0) -> ParamRule:
    """The rule of one Megatron parameter name (local layer index, experts numbered globally as in an EP=1
    model), e.g. for a name from a TP-gathered state_dict()."""
    match = _LAYER.match(megatron_name)
    if match:
        local, suffix = int(match.group(1)), match.group(2)
        hf_prefix = f"model.layers.{layer_offset + local}."
        expert = LOCAL_EXPERT.match(suffix)
        if expert:  # only this expert's rules: a layer may have hundreds
            suffix_rules = moe_mlp_rules(spec, as_config_dict(hf_config), experts=[int(expert.group(1))])
        else:
            suffix_rules = layer_rules(spec, hf_config, ep_size=1)
        found = [(hf, kind) for m, hf, kind in suffix_rules if m == suffix]
        assert found, f"{spec.family}: no HF source for Megatron parameter {megatron_name!r}"
        hf, kind = found[0]
        return ParamRule(megatron_name, tuple(hf_prefix + s for s in hf), kind)
    rules = param_rules(spec, hf_config, num_layers=0, pre_process=True, post_process=False)
    rules += param_rules(spec, hf_config, num_layers=0, pre_process=False, post_process=True)
    found = [r for r in rules if r.megatron == megatron_name]
    assert found, f"{spec.family}: no HF source for Megatron parameter {megatron_name!r}"
    return found[0]


def to_megatron(rule: ParamRule, hf_tensors: list[torch.Tensor], hf_config) -> torch.Tensor:
    """The full Megatron tensor of `rule` from its HF tensors (in rule.hf order)."""
    if rule.kind == QKV:
        return interleave_qkv(*hf_tensors, **_attention_shape(hf_config))
    if rule.kind == GATE_UP:
        return torch.cat(hf_tensors, dim=0)
    (tensor,) = hf_tensors
    return tensor


def to_hf(rule: ParamRule, megatron_tensor: torch.Tensor, hf_config) -> dict[str, torch.Tensor]:
    """HF name -> tensor for one full Megatron tensor (empty for the tied output layer copy)."""
    if not rule.exported:
        return {}
    if rule.kind == QKV:
        parts = split_qkv(megatron_tensor, **_attention_shape(hf_config))
    elif rule.kind == GATE_UP:
        parts = megatron_tensor.chunk(2, dim=0)
    else:
        parts = (megatron_tensor,)
    return dict(zip(rule.hf, parts, strict=True))


def interleave_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, groups: int, head_dim: int
) -> torch.Tensor:
    """HF q/k/v projections (weights or biases) -> Megatron's [q heads of group 0, k0, v0, group 1 ...].

    Megatron views linear_qkv's output as [groups, (heads/groups + 2) * head_dim] and splits each group.
    """
    rest = q.shape[1:]
    per_group = [
        q.reshape(groups, heads // groups * head_dim, *rest),
        k.reshape(groups, head_dim, *rest),
        v.reshape(groups, head_dim, *rest),
    ]
    return torch.cat(per_group, dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, heads: int, groups: int, head_dim: int) -> tuple:
    """Inverse of interleave_qkv: Megatron's linear_qkv tensor -> (q, k, v) in HF layout."""
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (heads // groups + 2) * head_dim, *rest)
    q, k, v = grouped.split([heads // groups * head_dim, head_dim, head_dim], dim=1)
    return tuple(t.reshape(-1, *rest).contiguous() for t in (q, k, v))


def te_param_name(local_spec_name: str) -> str:
    """The name of a local-spec parameter in Megatron's Transformer Engine spec (GPU), which fuses the
    input and pre-MLP norms into the following linear layer (as the local spec's sharded_state_dict_keys_map
    declares). Not exercised on CPU.
    """
    return local_spec_name.replace(
        "input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"
    ).replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")


def _attention_shape(hf_config) -> dict:
    cfg = as_config_dict(hf_config)
    heads = cfg["num_attention_heads"]
    return dict(
        heads=heads,
        groups=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
    )
