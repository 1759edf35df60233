"""HF safetensors -> Megatron distributed checkpoint, one process per rank of the target layout.

Each rank builds its own GPTModel (local spec) for its pipeline stage (and virtual stages), fills it with
its slices via hf_to_megatron_shard (reading only the HF tensors it needs) and takes part in
`dist_checkpointing.save(sharded_state_dict)`. The result loads into any other TP/PP/EP layout through
dist_checkpointing's resharding. Next to it, SOURCE_FILE records what export needs: the HF config, the
family, the padded vocabulary, the expert storage layout, and a copy of the HF non-weight files
(tokenizer, generation config) under HF_ASSETS_DIR. tools/convert_hf_to_megatron.py is the CLI.
"""

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from distflow.config.dtypes import torch_dtype
from distflow.layout.model_shape import ModelShape
from distflow.models import tp_sharding
from distflow.models.conversion import HFCheckpoint, hf_to_megatron_shard
from distflow.models.hf_validation import check_hf_checkpoint
from distflow.models.moe import num_experts

SOURCE_FILE = "distflow_hf_source.json"
HF_ASSETS_DIR = "hf_assets"
FORMAT_VERSION = 1
_WEIGHT_SUFFIXES = (
    ".safetensors",
    ".safetensors.index.json",
    ".bin",
    ".bin.index.json",
    ".pt",
    ".pth",
    ".gguf",
)


@dataclass(frozen=True)
class CheckpointLayout:
    """The parallel layout a checkpoint is written from (any layout can read it back)."""

    tp: int = 1
    """Tensor parallel size."""
    pp: int = 1
    """Pipeline parallel size (layers split evenly over stages and virtual stages)."""
    ep: int = 1
    """Expert parallel size (MoE only): each rank holds num_experts / ep experts."""
    etp: int | None = None
    """Expert tensor parallel size; None: Megatron's default, the TP size."""
    vpp: int | None = None
    """Virtual pipeline stages per rank (None: none)."""

    def validate(self, hf_config: dict) -> None:
        """ValueError naming the sizes that do not divide the model (heads, KV heads, layers, experts)."""
        layers, experts = hf_config["num_hidden_layers"], num_experts(hf_config)
        shape = ModelShape.from_hf_config(hf_config)
        for what, count in (("attention heads", shape.num_heads), ("KV heads", shape.num_kv_heads)):
            if count % self.tp:
                raise ValueError(
                    f"--tp {self.tp} does not divide the model's {count} {what}; choose a tp that "
                    f"divides {count} ({[k for k in range(1, count + 1) if count % k == 0]})"
                )
        chunks = self.pp * (self.vpp or 1)
        if layers % chunks:
            raise ValueError(
                f"{layers} layers do not split evenly over --pp {self.pp} x --vpp {self.vpp or 1}"
            )
        if self.vpp and self.pp < 2:
            raise ValueError("vpp needs pp >= 2")
        if (self.ep > 1 or (self.etp or self.tp) != self.tp) and not experts:
            raise ValueError("ep / etp apply to MoE models only; this config has no experts")
        if experts and experts % self.ep:
            raise ValueError(f"--ep {self.ep} does not divide the model's {experts} experts")

    def data_parallel_size(self) -> int:
        """The smallest DP that Megatron accepts: TP x DP must be a multiple of ETP x EP."""
        expert_ranks = (self.etp or self.tp) * self.ep
        dp = 1
        while (self.tp * dp) % expert_ranks:
            dp += 1
        return dp

    def world_size(self) -> int:
        return self.tp * self.pp * self.data_parallel_size()


def build_stage_models(
    spec,
    hf_config: dict,
    layout: CheckpointLayout,
    padded_vocab: int,
    dtype: torch.dtype,
    initialize: bool = False,
    **config_overrides,
) -> list:
    """This rank's GPTModel chunks (one per virtual stage); Megatron's parallel state must be initialised
    with `layout`. initialize=False skips Megatron's random init (the weights are overwritten anyway);
    config_overrides go to TransformerConfig (e.g. moe_token_dispatcher_type).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        **spec.transformer_config_kwargs(
            hf_config,
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp,
            expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.etp,
            sequence_parallel=False,
            use_cpu_initialization=True,
            perform_initialization=initialize,
            params_dtype=dtype,
            pipeline_dtype=dtype,
            **config_overrides,
        )
    )
    fields = spec.gpt_model_fields(hf_config, layout.tp)
    chunks = []
    for vp_stage in range(layout.vpp or 1):
        vp = vp_stage if layout.vpp else None
        chunks.append(
            GPTModel(
                config=config,
                transformer_layer_spec=fields["layer_spec"],
                vocab_size=padded_vocab,
                max_sequence_length=fields["max_sequence_length"],
                position_embedding_type="rope",
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                share_embeddings_and_output_weights=fields["tie_embeddings"],
                rotary_base=fields["rotary_base"],
                rope_scaling=fields["rope_scaling"],
                rope_scaling_factor=fields["rope_scaling_factor"],
                vp_stage=vp,
            )
        )
    return chunks


def load_hf_into_chunks(chunks: list, spec, ckpt: HFCheckpoint, padded_vocab: int) -> None:
    """Copies this rank's slices of `ckpt` into every chunk, one decoder layer at a time (so that only the
    model and one layer's tensors are in memory); names and shapes must match the model exactly."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    for chunk in chunks:
        ranks = dict(
            tp_rank=ps.get_tensor_model_parallel_rank(),
            tp_size=ps.get_tensor_model_parallel_world_size(),
            ep_rank=ps.get_expert_model_parallel_rank(),
            ep_size=ps.get_expert_model_parallel_world_size(),
            etp_rank=ps.get_expert_tensor_parallel_rank(),
            etp_size=ps.get_expert_tensor_parallel_world_size(),
            padded_vocab_size=padded_vocab,
        )
        offset = get_transformer_layer_offset(chunk.config, vp_stage=getattr(chunk, "vp_stage", None))
        params = {n: t for n, t in chunk.state_dict(keep_vars=True).items() if not n.endswith("_extra_state")}
        filled = _copy_into(
            params,
            hf_to_megatron_shard(
                spec,
                ckpt.config,
                ckpt.get,
                num_layers=0,
                pre_process=chunk.pre_process,
                post_process=chunk.post_process,
                **ranks,
            ),
        )
        for local in range(len(chunk.decoder.layers)):
            layer = hf_to_megatron_shard(
                spec,
                ckpt.config,
                ckpt.get,
                layer_offset=offset + local,
                num_layers=1,
                pre_process=False,
                post_process=False,
                **ranks,
            )
            filled |= _copy_into(
                params,
                {n.replace("decoder.layers.0.", f"decoder.layers.{local}.", 1): t for n, t in layer.items()},
            )
        if filled != params.keys():
            raise RuntimeError(
                f"{ckpt.model_dir}: the {spec.family} mapping leaves GPTModel parameters unset: "
                f"{sorted(params.keys() - filled)}"
            )


def _copy_into(params: dict, shard: dict) -> set:
    """Copies shard tensors into the model's parameters of the same name; returns the names filled."""
    for name, tensor in shard.items():
        if name not in params or params[name].shape != tensor.shape:
            expected = tuple(params[name].shape) if name in params else "no such parameter"
            raise RuntimeError(f"converted {name} {tuple(tensor.shape)} does not fit GPTModel ({expected})")
        with torch.no_grad():
            params[name].copy_(tensor)
    return set(shard)


def sharded_state_dict(chunks: list) -> dict:
    """What dist_checkpointing saves/loads: Megatron-LM's nesting (model0, model1, ... with VPP)."""
    if len(chunks) == 1:
        return chunks[0].sharded_state_dict()
    return {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(chunks)}


def convert_rank(hf_dir, out_dir, layout: CheckpointLayout) -> None:
    """The work of one rank: called on every rank of the layout after torch.distributed is initialised."""
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    ckpt = HFCheckpoint(hf_dir)
    spec = check_hf_checkpoint(ckpt)
    layout.validate(ckpt.config)
    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
    )
    padded_vocab = tp_sharding.padded_vocab_size(ckpt.config["vocab_size"], layout.tp)
    chunks = build_stage_models(spec, ckpt.config, layout, padded_vocab, hf_dtype(ckpt.config))
    load_hf_into_chunks(chunks, spec, ckpt, padded_vocab)
    out_dir = Path(out_dir)
    if dist.get_rank() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(sharded_state_dict(chunks), str(out_dir))
    if dist.get_rank() == 0:
        write_source(out_dir, ckpt, spec, layout, padded_vocab)
    dist.barrier()
    ps.destroy_model_parallel()


def write_source(
    out_dir: Path, ckpt: HFCheckpoint, spec, layout: CheckpointLayout, padded_vocab: int
) -> None:
    """SOURCE_FILE and the HF non-weight files, so that export rebuilds config and tokenizer."""
    assets = out_dir / HF_ASSETS_DIR
    assets.mkdir(exist_ok=True)
    for f in ckpt.model_dir.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, assets / f.name)
    source = dict(
        format_version=FORMAT_VERSION,
        family=spec.family,
        hf_architecture=spec.hf_architecture,
        hf_source_dir=str(ckpt.model_dir.resolve()),
        hf_config=ckpt.config,
        padded_vocab_size=padded_vocab,
        expert_layout=ckpt.expert_layout,
        dtype=str(hf_dtype(ckpt.config)).removeprefix("torch."),
        saved_layout=asdict(layout),
    )
    (out_dir / SOURCE_FILE).write_text(json.dumps(source, indent=1, sort_keys=True) + "\n")


def read_source(megatron_dir) -> dict:
    path = Path(megatron_dir) / SOURCE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{megatron_dir}: no {SOURCE_FILE}; was it written by tools/convert_hf_to_megatron.py?"
        )
    source = json.loads(path.read_text())
    assert source["format_version"] == FORMAT_VERSION, (
        f"{path}: unknown format_version {source['format_version']}"
    )
    return source


def hf_dtype(hf_config: dict) -> torch.dtype:
    """The checkpoint's parameter dtype (config `dtype`, or `torch_dtype` in older configs); fp32 if absent."""
    name = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float32"
    return torch_dtype(name, "config dtype")
