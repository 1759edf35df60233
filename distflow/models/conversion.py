"""HF checkpoint <-> Megatron GPTModel state: a rank builds its own shard, and a gathered state goes back.

`hf_to_megatron_shard` reads only the HF tensors its pipeline stage needs, through a getter (e.g.
HFCheckpoint.get), and returns exactly the state_dict entries of that rank's GPTModel (local spec).
`megatron_full_to_hf` is the inverse for TP-gathered (full) tensors of one stage or the whole model.
"""
import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open

from distflow.models import tp_sharding, weight_mapping
from distflow.models.spec import DenseFamilySpec, as_config_dict


def hf_to_megatron_shard(spec: DenseFamilySpec, hf_config, get_hf_tensor: Callable[[str], torch.Tensor], *,
                         tp_rank: int = 0, tp_size: int = 1, layer_offset: int = 0,
                         num_layers: int | None = None, pre_process: bool = True, post_process: bool = True,
                         make_vocab_size_divisible_by: int = 128) -> dict[str, torch.Tensor]:
    """Megatron name -> this rank's tensor, for the stage holding layers layer_offset .. +num_layers."""
    cfg = as_config_dict(hf_config)
    padded_vocab = tp_sharding.padded_vocab_size(cfg["vocab_size"], tp_size, make_vocab_size_divisible_by)
    state = {}
    for rule in weight_mapping.param_rules(spec, cfg, layer_offset=layer_offset, num_layers=num_layers,
                                           pre_process=pre_process, post_process=post_process):
        full = weight_mapping.to_megatron(rule, [get_hf_tensor(name) for name in rule.hf], cfg)
        state[rule.megatron] = tp_sharding.shard(rule.megatron, full, tp_rank, tp_size, padded_vocab)
    return state


def megatron_shards_to_full(tp_states: list[dict[str, torch.Tensor]], vocab_size: int) -> dict[str, torch.Tensor]:
    """One stage's state from every TP rank's state (rank order) -> full tensors with the HF vocabulary."""
    return {name: tp_sharding.unshard(name, [s[name] for s in tp_states], vocab_size)
            for name in tp_states[0] if not name.endswith("_extra_state")}


def megatron_full_to_hf(spec: DenseFamilySpec, hf_config, megatron_full: dict[str, torch.Tensor], *,
                        layer_offset: int = 0) -> dict[str, torch.Tensor]:
    """HF name -> tensor for full Megatron tensors of a stage whose first layer is global layer_offset."""
    cfg = as_config_dict(hf_config)
    hf = {}
    for name, tensor in megatron_full.items():
        if not name.endswith("_extra_state"):
            hf.update(weight_mapping.to_hf(weight_mapping.rule_for(spec, cfg, name, layer_offset), tensor, cfg))
    return hf


class HFCheckpoint:
    """Lazy reader of a HF model directory's safetensors (single file or sharded with an index)."""

    def __init__(self, model_dir):
        self.model_dir = Path(model_dir)
        index = self.model_dir / "model.safetensors.index.json"
        if index.exists():
            self._file_of = json.loads(index.read_text())["weight_map"]
        else:
            with safe_open(self.model_dir / "model.safetensors", "pt") as f:
                self._file_of = {name: "model.safetensors" for name in f.keys()}
        self.config = json.loads((self.model_dir / "config.json").read_text())

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def get(self, name: str) -> torch.Tensor:
        assert name in self._file_of, f"{self.model_dir}: no tensor {name!r} in the checkpoint"
        with safe_open(self.model_dir / self._file_of[name], "pt") as f:
            return f.get_tensor(name)
