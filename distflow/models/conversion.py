"""HF checkpoint <-> Megatron GPTModel state: a rank builds its own shard, and a gathered state goes back.

`hf_to_megatron_shard` reads only the HF tensors its pipeline stage needs, through a getter (e.g.
HFCheckpoint.get), and returns exactly the state_dict entries of that rank's GPTModel (local spec).
`megatron_full_to_hf` is the inverse for TP-gathered (full) tensors of one stage or the whole model;
`merge_expert_parallel` first renumbers the experts of every EP rank globally. Whole checkpoints go
through checkpoint_import.py / checkpoint_export.py (Megatron dist checkpoints).
"""

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open

from distflow.models import expert_layout, tp_sharding, weight_mapping
from distflow.models.registry import spec_for
from distflow.models.spec import DenseFamilySpec, as_config_dict


def hf_to_megatron_shard(
    spec: DenseFamilySpec,
    hf_config,
    get_hf_tensor: Callable[[str], torch.Tensor],
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    layer_offset: int = 0,
    num_layers: int | None = None,
    pre_process: bool = True,
    post_process: bool = True,
    make_vocab_size_divisible_by: int = 128,
    ep_rank: int = 0,
    ep_size: int = 1,
    etp_rank: int | None = None,
    etp_size: int | None = None,
    padded_vocab_size: int | None = None,
) -> dict[str, torch.Tensor]:
    """Megatron name -> this rank's tensor, for the stage holding layers layer_offset .. +num_layers.

    MoE: the rank holds the experts of EP rank ep_rank (as local experts 0, 1, ...), each split over the
    expert tensor-parallel group (etp_rank/etp_size, Megatron's default: the TP group). padded_vocab_size
    overrides the TP padding rule (a checkpoint's recorded size, when loading into another layout).
    """
    cfg = as_config_dict(hf_config)
    padded_vocab = padded_vocab_size or tp_sharding.padded_vocab_size(
        cfg["vocab_size"], tp_size, make_vocab_size_divisible_by
    )
    etp_rank, etp_size = (tp_rank, tp_size) if etp_size is None else (etp_rank, etp_size)
    state = {}
    for rule in weight_mapping.param_rules(
        spec,
        cfg,
        layer_offset=layer_offset,
        num_layers=num_layers,
        pre_process=pre_process,
        post_process=post_process,
        ep_rank=ep_rank,
        ep_size=ep_size,
    ):
        full = weight_mapping.to_megatron(rule, [get_hf_tensor(name) for name in rule.hf], cfg)
        rank, size = (
            (etp_rank, etp_size) if tp_sharding.is_expert_param(rule.megatron) else (tp_rank, tp_size)
        )
        state[rule.megatron] = tp_sharding.shard(rule.megatron, full, rank, size, padded_vocab)
    return state


def megatron_shards_to_full(
    tp_states: list[dict[str, torch.Tensor]], vocab_size: int
) -> dict[str, torch.Tensor]:
    """One stage's state from every TP rank's state (rank order) -> full tensors with the HF vocabulary.
    With MoE the experts' shards must come from the expert-TP ranks (the same ranks unless ETP != TP)."""
    return {
        name: tp_sharding.unshard(name, [s[name] for s in tp_states], vocab_size)
        for name in tp_states[0]
        if not name.endswith("_extra_state")
    }


def merge_expert_parallel(ep_states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One stage's states from every EP rank (rank order, same TP rank) -> one state whose experts are
    numbered globally, as in an EP=1 model (global expert = ep_rank * local experts per rank + local)."""
    merged = {}
    for ep_rank, state in enumerate(ep_states):
        per_rank = len({m.group(1) for n in state if (m := tp_sharding.LOCAL_EXPERT.search(n))})
        for name, tensor in state.items():
            match = tp_sharding.LOCAL_EXPERT.search(name)
            if match:
                global_e = ep_rank * per_rank + int(match.group(1))
                name = f"{name[: match.start(1)]}{global_e}{name[match.end(1) :]}"
            elif ep_rank > 0:
                continue  # non-expert parameters are replicated over EP ranks
            merged[name] = tensor
    return merged


def megatron_full_to_hf(
    spec: DenseFamilySpec, hf_config, megatron_full: dict[str, torch.Tensor], *, layer_offset: int = 0
) -> dict[str, torch.Tensor]:
    """HF name -> tensor for full Megatron tensors of a stage whose first layer is global layer_offset."""
    cfg = as_config_dict(hf_config)
    hf = {}
    for name, tensor in megatron_full.items():
        if not name.endswith("_extra_state"):
            hf.update(
                weight_mapping.to_hf(weight_mapping.rule_for(spec, cfg, name, layer_offset), tensor, cfg)
            )
    return hf


class HFCheckpoint:
    """Lazy reader of a HF model directory's safetensors (single file or sharded with an index).

    Tensors are named canonically (weight_mapping's HF names): a checkpoint whose MoE experts are stored
    fused (expert_layout.FUSED) is presented per expert, each read as a slice of the fused tensor.
    """

    def __init__(self, model_dir):
        self.model_dir = Path(model_dir)
        index = self.model_dir / "model.safetensors.index.json"
        if index.exists():
            file_of = json.loads(index.read_text())["weight_map"]
        else:
            with safe_open(self.model_dir / "model.safetensors", "pt") as f:
                file_of = {name: "model.safetensors" for name in f.keys()}
        self.config = json.loads((self.model_dir / "config.json").read_text())
        self.expert_layout = expert_layout.detect(file_of)
        """expert_layout.PER_EXPERT or FUSED: how this checkpoint stores MoE experts."""
        self._stored_shapes = {}
        for file in sorted(set(file_of.values())):
            with safe_open(self.model_dir / file, "pt") as f:
                self._stored_shapes.update(
                    {n: tuple(f.get_slice(n).get_shape()) for n in f.keys() if n in file_of}
                )
        self._file_of = file_of
        if self.expert_layout == expert_layout.FUSED:
            self._sources = expert_layout.fused_sources(spec_for(self.config), self._stored_shapes)
        else:
            self._sources = {n: expert_layout.StoredSlice(n) for n in file_of}

    def names(self) -> list[str]:
        return sorted(self._sources)

    def shape(self, name: str) -> tuple:
        """The tensor's shape, read from the file header only."""
        where = self._where(name)
        shape = self._stored_shapes[where.stored]
        if where.expert is None:
            return shape
        return shape[1:] if where.part == "down" else (shape[1] // 2, *shape[2:])

    def get(self, name: str) -> torch.Tensor:
        where = self._where(name)
        with safe_open(self.model_dir / self._file_of[where.stored], "pt") as f:
            if where.expert is None:
                return f.get_tensor(where.stored)
            return expert_layout.read_slice(
                f.get_slice(where.stored), where, self._stored_shapes[where.stored]
            )

    def _where(self, name: str) -> "expert_layout.StoredSlice":
        assert name in self._sources, f"{self.model_dir}: no tensor {name!r} in the checkpoint"
        return self._sources[name]
