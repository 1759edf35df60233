"""Where a model's weights live inside a running SGLang engine, per engine TP rank (pure; no SGLang import).

For every SGLang parameter of one engine TP rank: its name, its shape, and which regions of which full
Hugging Face tensors fill it (`TargetSpec`). Rows SGLang pads (vocabulary padding) are covered by no
segment and hold zeros, as after SGLang's own loading. Dense families follow SGLang's fused, TP-sharded
modules (checked against a running engine's parameters with engine_side.probe, engine TP 1 and 2):
- `model.embed_tokens.weight`, `lm_head.weight` (absent when tied): the vocabulary padded to a multiple of
  64 (64 * tp when that does not split evenly), split by rows;
- `self_attn.qkv_proj.weight/.bias` = cat(q, k, v) of the rank's heads; K/V heads are replicated when the
  engine TP exceeds the KV heads (rank r holds KV head r // (tp / kv_heads); SGLang's CPU engine pads
  instead, see cpu_engine_pads);
- `self_attn.o_proj.weight`, `mlp.down_proj.weight`: columns split;
- `mlp.gate_up_proj.weight` = cat(the rank's gate rows, the rank's up rows);
- norms (and Qwen3's `q_norm`/`k_norm`) replicated.
MoE families (Mixtral, Qwen2-MoE, Qwen3-MoE) have the same attention, norms and embeddings; their MoE block
(fused experts, router, shared expert) is described in sglang_moe_layout.
`hf_full_targets` is the fallback for families without such a mapping and for models SGLang's CPU engine
pads: every engine rank receives the full HF-named tensors and SGLang's own `load_weights` shards them.
"""

from dataclasses import dataclass

from distflow.coordination.weights.regions import Region, full_region, volume
from distflow.models import weight_mapping
from distflow.models.moe import num_experts
from distflow.models.registry import SPECS
from distflow.models.spec import as_config_dict

SHARD_FAMILIES = tuple(spec.family for spec in SPECS.values() if spec.sglang_shards)
"""Families whose spec says SGLang takes its shards (DenseFamilySpec.sglang_shards): the dense Llama layout
above, the MoE ones with their MLP replaced by sglang_moe_layout's fused experts."""
SGLANG_PADDED_WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")
"""Config keys SGLang's CPU engine pads (sglang.srt.configs.update_config: every one the config has)."""
SGLANG_VOCAB_PADDING = 64  # sglang.srt.layers.vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE


@dataclass(frozen=True)
class Segment:
    """target[dst] = hf_tensor(hf_name)[src] (both regions have the same extents)."""

    hf_name: str
    src: Region
    dst: Region


@dataclass(frozen=True)
class TargetSpec:
    """One tensor an engine rank receives: SGLang's parameter name (or the HF name in the fallback)."""

    name: str
    shape: tuple[int, ...]
    segments: tuple[Segment, ...]

    @property
    def numel(self) -> int:
        return volume(full_region(self.shape))

    @property
    def fully_covered(self) -> bool:
        """False when some elements are padding that no segment writes (they must be zero)."""
        return sum(volume(s.dst) for s in self.segments) == self.numel


@dataclass(frozen=True)
class Dims:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool

    @classmethod
    def of(cls, hf_config) -> "Dims":
        cfg = as_config_dict(hf_config)
        heads = cfg["num_attention_heads"]
        return cls(
            layers=cfg["num_hidden_layers"],
            hidden=cfg["hidden_size"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            ffn=cfg.get("intermediate_size", 0),
            vocab=cfg["vocab_size"],
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )


def sglang_padded_vocab(vocab: int, engine_tp: int) -> int:
    """SGLang's VocabParallelEmbedding/ParallelLMHead row count (all ranks together)."""
    pad = SGLANG_VOCAB_PADDING
    if _round_up(vocab, pad) % engine_tp:
        pad *= engine_tp
    return _round_up(vocab, pad)


def cpu_engine_pads(hf_config, engine_tp: int) -> str | None:
    """Why SGLang's CPU engine would lay this model out differently, or None.

    On CPU SGLang pads instead of splitting unevenly (sglang.srt.configs.update_config,
    adjust_config_with_unaligned_cpu_tp): KV heads not divisible by the engine TP are padded with zero heads
    (no replication), and MLP widths (dense, routed experts', shared expert's: SGLANG_PADDED_WIDTHS) are padded
    to a multiple of 32 * engine TP, which leaves zero rows inside gate_up_proj / w13_weight. The shard layout
    above is the GPU one; such models take the HF-named fallback.
    """
    cfg = as_config_dict(hf_config)
    d = Dims.of(cfg)
    if d.heads % engine_tp or d.kv_heads % engine_tp:
        return f"{d.heads} heads / {d.kv_heads} KV heads are padded to a multiple of engine_tp={engine_tp}"
    for key in SGLANG_PADDED_WIDTHS:
        if cfg.get(key) and cfg[key] % (32 * engine_tp):
            return f"{key} {cfg[key]} is padded to a multiple of 32 * engine_tp={engine_tp}"
    return None


def sglang_shard_targets(spec, hf_config, engine_tp: int, rank: int) -> list[TargetSpec]:
    """Every parameter of engine TP rank `rank` of `engine_tp`, in model order, for a SHARD_FAMILIES model."""
    from distflow.coordination.weights import sglang_moe_layout  # noqa: PLC0415 - a cycle: it builds on this module's helpers

    assert spec.sglang_shards, (
        f"{spec.family}: no SGLang shard layout; use the HF-named fallback (hf_full_targets)"
    )
    d = Dims.of(hf_config)
    if d.heads % engine_tp or (d.kv_heads % engine_tp and engine_tp % d.kv_heads):
        raise ValueError(f"engine_tp={engine_tp} does not fit {d.heads} heads / {d.kv_heads} KV heads")
    assert 0 <= rank < engine_tp, f"engine rank {rank} outside engine_tp={engine_tp}"
    heads = d.heads // engine_tp
    kv = max(1, d.kv_heads // engine_tp)
    kv_first = rank // max(1, engine_tp // d.kv_heads) * kv
    q_rows, kv_rows = heads * d.head_dim, kv * d.head_dim

    def vocab_rows(name):
        per = sglang_padded_vocab(d.vocab, engine_tp) // engine_tp
        first = rank * per
        real = max(0, min(per, d.vocab - first))
        segments = (
            (Segment(name, ((first, real), (0, d.hidden)), ((0, real), (0, d.hidden))),) if real else ()
        )
        return TargetSpec(name, (per, d.hidden), segments)

    out = [vocab_rows("model.embed_tokens.weight")]
    for layer in range(d.layers):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        qkv = [
            (a + "q_proj.{}", rank * q_rows, q_rows),
            (a + "k_proj.{}", kv_first * d.head_dim, kv_rows),
            (a + "v_proj.{}", kv_first * d.head_dim, kv_rows),
        ]
        out.append(full(p + "input_layernorm.weight", (d.hidden,)))
        out.append(
            rows(
                a + "qkv_proj.weight",
                (q_rows + 2 * kv_rows, d.hidden),
                [(n.format("weight"), f, c) for n, f, c in qkv],
            )
        )
        if spec.qkv_bias:
            out.append(
                rows(
                    a + "qkv_proj.bias",
                    (q_rows + 2 * kv_rows,),
                    [(n.format("bias"), f, c) for n, f, c in qkv],
                )
            )
        if spec.qk_layernorm:
            out += [full(a + "q_norm.weight", (d.head_dim,)), full(a + "k_norm.weight", (d.head_dim,))]
        out.append(columns(a + "o_proj.weight", a + "o_proj.weight", d.hidden, rank * q_rows, q_rows))
        out.append(full(p + "post_attention_layernorm.weight", (d.hidden,)))
        if spec.moe:
            out += sglang_moe_layout.moe_block_targets(spec, hf_config, engine_tp, rank, layer)
        else:
            out += gated_mlp_targets(p + "mlp.", p + "mlp.", d.ffn, d.hidden, engine_tp, rank)
    out.append(full("model.norm.weight", (d.hidden,)))
    if not d.tied:
        out.append(vocab_rows("lm_head.weight"))
    return out


def gated_mlp_targets(
    sglang_prefix: str, hf_prefix: str, ffn: int, hidden: int, engine_tp: int, rank: int
) -> list[TargetSpec]:
    """SGLang's tensor-parallel gated MLP (a dense MLP, Qwen2-MoE's shared expert): `gate_up_proj.weight` =
    cat(the rank's gate rows, the rank's up rows), `down_proj.weight` = the rank's columns."""
    if ffn % engine_tp:
        raise ValueError(f"{hf_prefix}: FFN width {ffn} does not split over engine_tp={engine_tp}")
    f = ffn // engine_tp
    return [
        rows(
            sglang_prefix + "gate_up_proj.weight",
            (2 * f, hidden),
            [(hf_prefix + "gate_proj.weight", rank * f, f), (hf_prefix + "up_proj.weight", rank * f, f)],
        ),
        columns(sglang_prefix + "down_proj.weight", hf_prefix + "down_proj.weight", hidden, rank * f, f),
    ]


def rows(name: str, shape: tuple[int, ...], parts) -> TargetSpec:
    """Target = cat over `parts` of (hf name, first row, row count) along dim 0 (other dims whole)."""
    segments, at = [], 0
    for hf, first, count in parts:
        rest = tuple((0, n) for n in shape[1:])
        segments.append(Segment(hf, ((first, count),) + rest, ((at, count),) + rest))
        at += count
    assert at == shape[0], f"{name}: rows {at} != {shape[0]}"
    return TargetSpec(name, shape, tuple(segments))


def columns(name: str, hf: str, rows_: int, first: int, count: int) -> TargetSpec:
    """Target = columns first .. first+count of the 2-D HF tensor `hf`."""
    return TargetSpec(
        name, (rows_, count), (Segment(hf, ((0, rows_), (first, count)), ((0, rows_), (0, count))),)
    )


def full(name: str, shape: tuple[int, ...], hf: str | None = None) -> TargetSpec:
    """Target = the whole HF tensor `hf` (default: the same name), replicated on every engine rank."""
    region = full_region(shape)
    return TargetSpec(name, shape, (Segment(hf or name, region, region),))


def hf_full_targets(spec, hf_config, hf_shapes: dict[str, tuple] | None = None) -> list[TargetSpec]:
    """The fallback: every HF tensor the model exports, whole, in model order (SGLang's loader splits them).

    Shapes come from the config (hf_tensor_shape) unless hf_shapes (name -> shape) gives them.
    """
    cfg = as_config_dict(hf_config)
    names = [hf for rule in weight_mapping.param_rules(spec, cfg) if rule.exported for hf in rule.hf]
    shapes = hf_shapes or {}
    out = []
    for name in names:
        shape = tuple(shapes[name]) if name in shapes else hf_tensor_shape(spec, cfg, name)
        region = full_region(shape)
        out.append(TargetSpec(name, shape, (Segment(name, region, region),)))
    return out


def hf_tensor_shape(spec, hf_config, name: str) -> tuple[int, ...]:
    """The shape of one HF tensor of a supported family (dense or MoE), from the config alone."""
    cfg = as_config_dict(hf_config)
    d = Dims.of(cfg)
    if spec.moe:
        block = f".{spec.hf_moe_block}."
        gate, up, down = spec.hf_expert_projections
        if f"{block}experts." in name:
            ffn = cfg[spec.hf_expert_ffn_key]
            return (d.hidden, ffn) if name.endswith(f".{down}.weight") else (ffn, d.hidden)
        if name.endswith(f"{block}gate.weight"):  # the router
            return (num_experts(cfg), d.hidden)
        if ".shared_expert_gate." in name:
            return (1, d.hidden)
        if ".shared_expert." in name:
            ffn = cfg["shared_expert_intermediate_size"]
            return (d.hidden, ffn) if name.endswith(".down_proj.weight") else (ffn, d.hidden)
    return dense_hf_shape(name, d)


def dense_hf_shape(name: str, d: Dims) -> tuple[int, ...]:
    """The shape of a dense family's HF tensor, from the config alone."""
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    by_suffix = {
        "embed_tokens.weight": (d.vocab, d.hidden),
        "lm_head.weight": (d.vocab, d.hidden),
        "layernorm.weight": (d.hidden,),
        "model.norm.weight": (d.hidden,),
        "q_proj.weight": (q, d.hidden),
        "k_proj.weight": (kv, d.hidden),
        "v_proj.weight": (kv, d.hidden),
        "q_proj.bias": (q,),
        "k_proj.bias": (kv,),
        "v_proj.bias": (kv,),
        "o_proj.weight": (d.hidden, q),
        "q_norm.weight": (d.head_dim,),
        "k_norm.weight": (d.head_dim,),
        "gate_proj.weight": (d.ffn, d.hidden),
        "up_proj.weight": (d.ffn, d.hidden),
        "down_proj.weight": (d.hidden, d.ffn),
    }
    for suffix, shape in by_suffix.items():
        if name.endswith(suffix):
            return shape
    raise ValueError(f"no shape rule for HF tensor {name!r}; pass hf_shapes (e.g. from HFCheckpoint.shape)")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
