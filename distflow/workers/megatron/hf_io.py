"""Moves weights between a Hugging Face checkpoint and this rank's Megatron GPTModel, via the family spec.

load_hf_weights: each rank reads only the HF tensors of its model chunks (its pipeline stage, or its
virtual stages) and keeps its TP (and EP/ETP) slice.
gather_hf_state: collects every rank's shard on rank 0 and returns the HF state dict there. It holds
the whole model in rank 0's memory, which is right for tiny and small models (smoke runs, tests); large
models are exported stage by stage by the conversion tool.
"""

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from distflow.models.conversion import (
    HFCheckpoint,
    hf_to_megatron_shard,
    megatron_full_to_hf,
    megatron_shards_to_full,
    merge_expert_parallel,
)
from distflow.models.tp_sharding import is_expert_param


def chunk_layers(config, chunk, vp_stage: int | None) -> tuple[int, int]:
    """(first global layer, layer count) of one model chunk, by Megatron's own layer assignment (even
    split, uneven first/last stages or a custom layout passed through TransformerConfig)."""
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return get_transformer_layer_offset(config, vp_stage=vp_stage), len(chunk.decoder.layers)


def _vp_stages(chunks: list) -> list:
    return list(range(len(chunks))) if len(chunks) > 1 else [getattr(chunks[0], "vp_stage", None)]


def load_hf_weights(
    chunks: list, spec, checkpoint: HFCheckpoint, config, skip_output_layer: bool = False
) -> None:
    """Copies this rank's slices of `checkpoint` into each of its model chunks (GPTModel, unwrapped).

    Every parameter must be covered, except the output layer with skip_output_layer (the critic's value
    head replaces it). MoE experts are those of this rank's EP rank, split over its expert-TP group.
    """
    from megatron.core import parallel_state as ps

    cfg = checkpoint.config
    for chunk, vp_stage in zip(chunks, _vp_stages(chunks)):
        offset, count = chunk_layers(config, chunk, vp_stage)
        shard = hf_to_megatron_shard(
            spec,
            cfg,
            checkpoint.get,
            tp_rank=ps.get_tensor_model_parallel_rank(),
            tp_size=ps.get_tensor_model_parallel_world_size(),
            layer_offset=offset,
            num_layers=count,
            pre_process=chunk.pre_process,
            post_process=chunk.post_process,
            ep_rank=ps.get_expert_model_parallel_rank(),
            ep_size=ps.get_expert_model_parallel_world_size(),
            etp_rank=ps.get_expert_tensor_parallel_rank(),
            etp_size=ps.get_expert_tensor_parallel_world_size(),
            padded_vocab_size=chunk.vocab_size,
        )
        if skip_output_layer:
            shard = {k: v for k, v in shard.items() if not k.startswith("output_layer.")}
        missing, unexpected = chunk.load_state_dict(shard, strict=False)
        missing = [
            k
            for k in missing
            if not k.endswith("_extra_state") and not (skip_output_layer and k.startswith("output_layer."))
        ]
        if missing or unexpected:
            raise RuntimeError(
                f"{checkpoint.model_dir}: the {spec.family} mapping left parameters unset {missing} "
                f"or produced unknown ones {unexpected}"
            )


def gather_hf_state(
    chunks: list, spec, hf_config: dict, config, tensors: str = "params", skip_output_layer: bool = False
) -> dict[str, torch.Tensor] | None:
    """HF-named full tensors of the whole model on global rank 0 (None elsewhere).

    tensors="params" gathers the weights; "grads" gathers the gradients Megatron DDP accumulated
    (`main_grad`, valid after a backward pass and before the next zero_grad_buffer; not with the
    distributed optimizer, which keeps only a shard of them reduced). skip_output_layer leaves out the
    critic's value head, which has no HF name.
    """
    from megatron.core import parallel_state as ps

    mine = []
    for chunk, vp_stage in zip(chunks, _vp_stages(chunks)):
        offset, _ = chunk_layers(config, chunk, vp_stage)
        if tensors == "params":
            items = chunk.state_dict().items()
        else:
            assert tensors == "grads", f"tensors={tensors!r}: 'params' or 'grads'"
            items = [(n, p.main_grad) for n, p in chunk.named_parameters()]
        state = {
            k: v.detach().float().cpu() if v.is_floating_point() else v.cpu()
            for k, v in items
            if not k.endswith("_extra_state") and not (skip_output_layer and k.startswith("output_layer."))
        }
        mine.append((vp_stage or 0, offset, state))
    key = dict(
        pp=ps.get_pipeline_model_parallel_rank(),
        tp=ps.get_tensor_model_parallel_rank(),
        dp=ps.get_data_parallel_rank(),
        ep=ps.get_expert_model_parallel_rank(),
        etp=ps.get_expert_tensor_parallel_rank(),
        edp=ps.get_expert_data_parallel_rank(),
    )
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object((key, mine), gathered, dst=0)
    if dist.get_rank() != 0:
        return None
    dense: dict[tuple, dict[int, dict]] = {}  # (pp, vp) -> tp rank -> non-expert tensors
    experts: dict[tuple, dict[int, dict[int, dict]]] = {}  # (pp, vp) -> ep rank -> etp rank -> expert tensors
    offsets = {}
    for key, rank_chunks in gathered:
        for vp_stage, offset, state in rank_chunks:
            stage = (key["pp"], vp_stage)
            offsets[stage] = offset
            if key["dp"] == 0:  # data-parallel replicas hold identical weights
                dense.setdefault(stage, {})[key["tp"]] = {
                    k: v for k, v in state.items() if not is_expert_param(k)
                }
            if key["edp"] == 0:
                experts.setdefault(stage, {}).setdefault(key["ep"], {})[key["etp"]] = {
                    k: v for k, v in state.items() if is_expert_param(k)
                }
    hf = {}
    for stage in sorted(dense, key=lambda s: offsets[s]):
        full = megatron_shards_to_full(
            [dense[stage][t] for t in sorted(dense[stage])], hf_config["vocab_size"]
        )
        by_ep = experts.get(stage, {})
        if any(state for by_etp in by_ep.values() for state in by_etp.values()):
            full.update(
                merge_expert_parallel(
                    [
                        megatron_shards_to_full(
                            [by_ep[e][t] for t in sorted(by_ep[e])], hf_config["vocab_size"]
                        )
                        for e in sorted(by_ep)
                    ]
                )
            )
        hf.update(megatron_full_to_hf(spec, hf_config, full, layer_offset=offsets[stage]))
    if hf_config.get("tie_word_embeddings"):
        hf.pop("lm_head.weight", None)  # the last PP stage's copy of the tied embedding
    return {k: v.to(_hf_dtype(hf_config)) if tensors == "params" else v for k, v in hf.items()}


def _hf_dtype(hf_config: dict) -> torch.dtype:
    name = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float32"
    return getattr(torch, name) if isinstance(name, str) else torch.float32


def save_hf_checkpoint(hf_state: dict[str, torch.Tensor], source_dir, out_dir) -> None:
    """Writes model.safetensors next to copies of the source's config, generation config and tokenizer."""
    source_dir, out_dir = Path(source_dir), Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in source_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, tmp / f.name)
    # Tied embeddings: HF keeps only the embedding, safetensors refuses shared storage.
    save_file(
        {k: v.contiguous().clone() for k, v in hf_state.items()},
        tmp / "model.safetensors",
        metadata={"format": "pt"},
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)  # a reader never sees a half-written checkpoint
