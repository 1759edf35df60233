"""This rank's Megatron parameters under the global names the weight plan uses (megatron_layout): layers and
routed experts numbered as in the whole model, not within this rank's pipeline stage or expert-parallel rank."""

import torch

from distflow.models.tp_sharding import LOCAL_EXPERT
from distflow.workers.megatron.hf_io import chunk_layers


def megatron_tensors(chunks: list, config) -> dict[str, torch.Tensor]:
    """This rank's Megatron parameters (every model chunk) under global names: decoder.layers.<global layer>,
    routed experts numbered globally (mlp.experts.local_experts.<ep rank * experts per rank + local>)."""
    # Megatron-Core is heavy and needed only where a model is trained: imported when one is.
    from megatron.core import parallel_state as ps

    vp_stages = list(range(len(chunks))) if len(chunks) > 1 else [getattr(chunks[0], "vp_stage", None)]
    experts_per_rank = (
        getattr(config, "num_moe_experts", None) or 0
    ) // ps.get_expert_model_parallel_world_size()
    first_expert = ps.get_expert_model_parallel_rank() * experts_per_rank
    out = {}
    for chunk, vp in zip(chunks, vp_stages):
        offset, _ = chunk_layers(config, chunk, vp)
        for name, param in chunk.named_parameters():
            out[global_name(name, offset, first_expert)] = param.detach()
    return out


def global_name(local_name: str, layer_offset: int, first_expert: int = 0) -> str:
    """A model chunk's parameter name with its layer (and routed expert) numbered globally."""
    name = local_name
    if name.startswith("decoder.layers."):
        local, rest = name[len("decoder.layers.") :].split(".", 1)
        name = f"decoder.layers.{layer_offset + int(local)}.{rest}"
    expert = LOCAL_EXPERT.search(name)
    if expert:
        name = f"{name[: expert.start(1)]}{first_expert + int(expert.group(1))}{name[expert.end(1) :]}"
    return name
