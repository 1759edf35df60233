"""Checks a HF checkpoint against its own config before anything is converted.

A checkpoint whose tensors disagree with its config.json (a missing or extra tensor, a wrong shape) or
whose architecture has no family spec is rejected with one error that names every offending tensor or
field, instead of failing later inside Megatron or, worse, converting silently wrong. Expected names come
from the weight mapping (every HF tensor some Megatron parameter is made of), expected shapes from the
config by the rules below.
"""

import re

from distflow.models import weight_mapping
from distflow.models.moe import num_experts
from distflow.models.registry import SPECS
from distflow.models.spec import DenseFamilySpec, as_config_dict


class InvalidHFCheckpoint(ValueError):
    """The HF checkpoint cannot be converted; the message says what is wrong and where."""


def spec_or_error(hf_config: dict, source: str = "config.json") -> DenseFamilySpec:
    """The family spec for the config, or InvalidHFCheckpoint naming the supported architectures."""
    architectures = hf_config.get("architectures") or []
    families = ", ".join(f"{arch} ({spec.family})" for arch, spec in sorted(SPECS.items()))
    if not architectures:
        raise InvalidHFCheckpoint(f"{source}: no `architectures` field; supported: {families}")
    if architectures[0] not in SPECS:
        raise InvalidHFCheckpoint(
            f"{source}: architecture {architectures[0]!r} has no model family spec; supported: {families}"
        )
    spec = SPECS[architectures[0]]
    try:
        spec.check_supported(hf_config)
        for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            assert key in hf_config, f"{spec.family}: config field {key!r} is missing"
    except AssertionError as error:
        raise InvalidHFCheckpoint(f"{source}: {error}") from None
    return spec


def expected_hf_shapes(spec: DenseFamilySpec, hf_config) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor a checkpoint of this config must hold (and no other)."""
    cfg = as_config_dict(hf_config)
    names = [name for rule in weight_mapping.param_rules(spec, cfg) if rule.exported for name in rule.hf]
    return {name: _shape(spec, cfg, name) for name in names}


def check_hf_checkpoint(ckpt) -> DenseFamilySpec:
    """Returns ckpt's family spec, or raises InvalidHFCheckpoint listing every disagreement (at most 10
    of each kind). ckpt: an HFCheckpoint (names(), shape(), config, model_dir)."""
    source = str(ckpt.model_dir / "config.json")
    spec = spec_or_error(ckpt.config, source)
    expected = expected_hf_shapes(spec, ckpt.config)
    present = set(ckpt.names())
    problems = []
    missing = sorted(expected.keys() - present)
    extra = sorted(present - expected.keys())
    wrong = [
        (n, ckpt.shape(n), expected[n])
        for n in sorted(expected.keys() & present)
        if ckpt.shape(n) != expected[n]
    ]
    if missing:
        problems.append(f"missing tensors ({len(missing)}): {missing[:10]}")
    if extra:
        problems.append(f"tensors the {spec.family} config does not explain ({len(extra)}): {extra[:10]}")
    if wrong:
        problems.append(
            f"shapes that disagree with the config ({len(wrong)}): "
            + "; ".join(f"{n} is {tuple(got)}, expected {want}" for n, got, want in wrong[:10])
        )
    if problems:
        raise InvalidHFCheckpoint(
            f"{ckpt.model_dir}: not a valid {spec.hf_architecture} checkpoint for its "
            f"config.json:\n  " + "\n  ".join(problems)
        )
    return spec


def _shape(spec, cfg: dict, name: str) -> tuple[int, ...]:
    """A HF tensor's shape from the config, by the tensor's role (the last name parts)."""
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    groups = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (vocab, hidden)
    if re.search(r"(input_layernorm|post_attention_layernorm|model\.norm)\.weight$", name):
        return (hidden,)
    attention = re.search(r"self_attn\.([qkvo])_proj\.(weight|bias)$", name)
    if attention:
        which, kind = attention.groups()
        out = heads * head_dim if which in "qo" else groups * head_dim
        if which == "o":
            return (hidden, out)
        return (out, hidden) if kind == "weight" else (out,)
    if re.search(r"self_attn\.[qk]_norm\.weight$", name):
        return (head_dim,)
    if spec.moe:
        gate, up, down = spec.hf_expert_projections
        if name.endswith(f"{spec.hf_moe_block}.gate.weight"):
            return (num_experts(cfg), hidden)
        if name.endswith("shared_expert_gate.weight"):
            return (1, hidden)
        ffn = (
            cfg["shared_expert_intermediate_size"]
            if ".shared_expert." in name
            else cfg[spec.hf_expert_ffn_key]
        )
        if re.search(rf"\.experts\.\d+\.{down}\.weight$", name) or name.endswith(
            "shared_expert.down_proj.weight"
        ):
            return (hidden, ffn)
        return (ffn, hidden)
    ffn = cfg["intermediate_size"]
    return (hidden, ffn) if name.endswith("down_proj.weight") else (ffn, hidden)
