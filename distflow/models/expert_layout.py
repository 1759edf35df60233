"""The two ways a HF checkpoint stores MoE experts, and the conversion between them.

- per-expert (released checkpoints; what transformers 5 `save_pretrained` writes by default): one tensor
  per expert and projection, `model.layers.L.{block}.experts.{e}.{gate|up|down}.weight` (Mixtral:
  block_sparse_moe, w1/w3/w2). The weight mapping speaks only these "canonical" names.
- fused (transformers 5's in-memory layout, written by `save_pretrained(save_original_format=False)`):
  per layer `model.layers.L.mlp.experts.gate_up_proj` [E, 2*ffn, hidden] (gate rows, then up rows, per
  expert) and `model.layers.L.mlp.experts.down_proj` [E, hidden, ffn]; every other tensor of the block is
  under `mlp.` (Mixtral's router: `mlp.gate.weight`).

`fused_sources` tells a reader where each canonical tensor lies in a fused file (a slice of which stored
tensor), and `fuse_layer` turns one layer's canonical tensors back into the fused ones for export.
"""

import re
from dataclasses import dataclass

import torch

PER_EXPERT, FUSED = "per_expert", "fused"
_FUSED = re.compile(r"^(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_CANONICAL_EXPERT = re.compile(r"^(model\.layers\.\d+)\.[a-z_]+\.experts\.(\d+)\.([a-z0-9_]+)\.weight$")


@dataclass(frozen=True)
class StoredSlice:
    """Where a canonical tensor lies in the file: all of `stored`, or expert `expert`'s `part` of it."""

    stored: str
    expert: int | None = None
    part: str | None = None
    """"gate" or "up" (halves of gate_up_proj's rows) or "down"; None with expert None."""


def detect(stored_names) -> str:
    """PER_EXPERT or FUSED (any fused expert tensor makes the file fused)."""
    return FUSED if any(_FUSED.match(n) for n in stored_names) else PER_EXPERT


def fused_sources(spec, stored_shapes: dict[str, tuple]) -> dict[str, StoredSlice]:
    """Canonical name -> StoredSlice for a fused file, from its stored names and shapes alone."""
    gate, up, down = spec.hf_expert_projections
    sources = {}
    for name, shape in stored_shapes.items():
        match = _FUSED.match(name)
        if match is None:
            sources[_canonical_block(spec, name)] = StoredSlice(name)
            continue
        layer, kind = match.groups()
        parts = (("gate", gate), ("up", up)) if kind == "gate_up_proj" else (("down", down),)
        for e in range(shape[0]):
            for part, projection in parts:
                sources[f"{layer}.{spec.hf_moe_block}.experts.{e}.{projection}.weight"] = StoredSlice(
                    name, e, part
                )
    return sources


def read_slice(tensor_slice, where: StoredSlice, stored_shape: tuple) -> torch.Tensor:
    """The canonical tensor from a safetensors slice object (reads only that expert's rows)."""
    if where.expert is None:
        return tensor_slice[:]
    e = where.expert
    if where.part == "down":
        return tensor_slice[e : e + 1].squeeze(0).contiguous()
    half = stored_shape[1] // 2
    rows = slice(0, half) if where.part == "gate" else slice(half, stored_shape[1])
    return tensor_slice[e : e + 1, rows].squeeze(0).contiguous()


def fuse_layer(spec, canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Canonical tensors of whole layers (every expert present) -> the fused file's names and tensors."""
    gate, up, down = spec.hf_expert_projections
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    stored = {}
    for name, tensor in canonical.items():
        match = _CANONICAL_EXPERT.match(name)
        if match is None:
            stored[_stored_block(spec, name)] = tensor
            continue
        layer, e, projection = match.group(1), int(match.group(2)), match.group(3)
        experts.setdefault(layer, {}).setdefault(e, {})[projection] = tensor
    for layer, by_expert in experts.items():
        order = sorted(by_expert)
        assert order == list(range(len(order))), f"{layer}: experts {order} are not all present to fuse"
        stored[f"{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([by_expert[e][gate], by_expert[e][up]]) for e in order]
        )
        stored[f"{layer}.mlp.experts.down_proj"] = torch.stack([by_expert[e][down] for e in order])
    return stored


def _canonical_block(spec, stored_name: str) -> str:
    # The fused layout calls every MoE block `mlp`; Mixtral's released name is block_sparse_moe.
    return re.sub(r"^(model\.layers\.\d+)\.mlp\.", rf"\1.{spec.hf_moe_block}.", stored_name)


def _stored_block(spec, canonical_name: str) -> str:
    return re.sub(rf"^(model\.layers\.\d+)\.{spec.hf_moe_block}\.", r"\1.mlp.", canonical_name)
