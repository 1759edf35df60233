"""Megatron distributed checkpoint -> HF safetensors, streaming one decoder layer at a time.

The checkpoint stores every parameter as one global (TP=1) tensor per key, decoder layers stacked on a
leading axis and routed experts on the next (`decoder.layers.mlp.experts.experts.linear_fc1.weight` is
[layers, experts, 2 * ffn, hidden]). `DistCheckpointReader` reads one layer's slice of each key, so only
that layer is in memory; the family's weight mapping turns it into HF tensors, which
`ShardedSafetensorsWriter` buffers into safetensors files of at most max_shard_bytes. Peak memory is
therefore about max_shard_bytes + twice the largest layer (loaded, then copied), whatever the model size.

Megatron's torch_dist format is PyTorch Distributed Checkpoint (DCP) storage, so the slices are read with
DCP's own resharding planner helpers, in one process without a process group. (Megatron's
dist_checkpointing.load cannot read part of a tensor at world size 1: it places the shards it does not
want on rank (rank + 1) % world_size, i.e. on itself.) tools/convert_megatron_to_hf.py is the CLI.
"""

import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from tqdm import tqdm

from distflow.config.dtypes import torch_dtype
from distflow.models import expert_layout, weight_mapping
from distflow.models.checkpoint_import import HF_ASSETS_DIR, hf_dtype, read_source
from distflow.models.checkpoint_import import SOURCE_FILE as SOURCE_FILE_NAME
from distflow.models.conversion import HFCheckpoint, megatron_full_to_hf
from distflow.models.hf_validation import InvalidHFCheckpoint, expected_hf_shapes, spec_or_error

_EXPERTS_KEY = "mlp.experts.experts."  # SequentialMLP's global-expert prefix in sharded keys
_LOCAL_EXPERT = "mlp.experts.local_experts."
_MODEL_MODULES = ("embedding", "decoder", "output_layer")  # GPTModel's top-level modules
# Weight files of an HF directory, never copied beside the exported ones (the import tool skips the same).
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".safetensors.index.json",
    ".bin",
    ".bin.index.json",
    ".pt",
    ".pth",
    ".gguf",
)


class InvalidMegatronCheckpoint(ValueError):
    """The dist checkpoint cannot be exported; the message names the checkpoint key, file or field at fault."""


class DistCheckpointReader:
    """Reads parts of a Megatron dist checkpoint as full (TP=1) Megatron state_dict tensors."""

    def __init__(self, megatron_dir, spec, hf_config: dict):
        self.dir = str(megatron_dir)
        self.spec, self.config = spec, hf_config
        try:
            stored = dcp.FileSystemReader(self.dir).read_metadata().state_dict_metadata
        except (OSError, EOFError, RuntimeError, ValueError) as error:
            raise InvalidMegatronCheckpoint(
                f"{self.dir}: cannot read the checkpoint index (.metadata): {type(error).__name__}: {error}"
            ) from None
        self.metadata = {k: m for k, m in stored.items() if isinstance(m, TensorStorageMetadata)}
        """Sharded-tensor key -> its global size, dtype and saved chunks."""
        self.num_layers = hf_config["num_hidden_layers"]
        self._used: set[str] = set()

    def layer(self, layer: int) -> dict[str, torch.Tensor]:
        """Local-spec names (`decoder.layers.{layer}.…`, experts numbered globally) -> full tensors."""
        wanted = {}  # local suffix -> (checkpoint key, expert index or None)
        for suffix, _, _ in weight_mapping.layer_rules(self.spec, self.config):
            wanted[suffix] = self._key_of(suffix)
        keys = {key for key, _ in wanted.values()}
        loaded = self._load({key: (layer, self.num_layers) for key in keys})
        return {
            f"decoder.layers.{layer}.{suffix}": loaded[key] if expert is None else loaded[key][expert]
            for suffix, (key, expert) in wanted.items()
        }

    def outside_layers(self, first: bool) -> dict[str, torch.Tensor]:
        """The embedding (first=True), or the final norm and untied output layer (first=False)."""
        rules = weight_mapping.param_rules(
            self.spec, self.config, num_layers=0, pre_process=first, post_process=not first
        )
        names = [r.megatron for r in rules if r.exported]
        missing = [n for n in names if n not in self.metadata]
        if missing:
            raise InvalidMegatronCheckpoint(
                f"{self.dir}: checkpoint has no {missing}; keys: {sorted(self.metadata)}"
            )
        return self._load({n: None for n in names})

    def unused_keys(self) -> list[str]:
        """Model keys no layer or outside part has read (after reading everything: a mapping gap).
        Keys outside GPTModel's modules (optimizer state, RNG) are not model weights and are ignored."""
        ignorable = {"output_layer.weight"} if self.config.get("tie_word_embeddings") else set()
        model_keys = {k for k in self.metadata if k.split(".", 1)[0] in _MODEL_MODULES}
        return sorted(model_keys - self._used - ignorable)

    def _key_of(self, local_suffix: str) -> tuple[str, int | None]:
        if local_suffix.startswith(_LOCAL_EXPERT):
            expert, rest = local_suffix[len(_LOCAL_EXPERT) :].split(".", 1)
            return f"decoder.layers.{_EXPERTS_KEY}{rest}", int(expert)
        # The local spec saves its norms under Transformer Engine's fused names (sharded_state_dict_keys_map).
        for candidate in (weight_mapping.te_param_name(local_suffix), local_suffix):
            if f"decoder.layers.{candidate}" in self.metadata:
                return f"decoder.layers.{candidate}", None
        raise InvalidMegatronCheckpoint(
            f"{self.dir}: no checkpoint key for decoder layer parameter {local_suffix!r}"
        )

    def _load(self, requests: dict[str, tuple[int, int] | None]) -> dict[str, torch.Tensor]:
        """key -> tensor, for requests key -> None (the whole tensor) or (layer, layer count): that layer's
        slice of the leading axis."""
        buffers, offsets = {}, {}
        for key, part in requests.items():
            size = self.metadata[key].size
            if part is not None and size[0] != part[1]:
                raise InvalidMegatronCheckpoint(
                    f"{self.dir}: {key} stacks {size[0]} decoder layers, but the recorded config has "
                    f"num_hidden_layers={part[1]}"
                )
            shape = size if part is None else (1, *size[1:])
            buffers[key] = torch.empty(shape, dtype=self.metadata[key].properties.dtype)
            offsets[key] = (0,) * len(size) if part is None else (part[0],) + (0,) * (len(size) - 1)
        with (
            warnings.catch_warnings()
        ):  # "torch.distributed is disabled ... load in a single process": intended
            warnings.simplefilter("ignore", UserWarning)
            try:
                dcp.load(
                    buffers,
                    storage_reader=dcp.FileSystemReader(self.dir),
                    planner=_SliceLoadPlanner(offsets),
                    no_dist=True,
                )
            except CheckpointException as error:  # a BaseException: would escape `except Exception`
                causes = "; ".join(
                    f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
                    for e, _ in error.failures.values()
                )
                raise InvalidMegatronCheckpoint(
                    f"{self.dir}: cannot read {sorted(requests)} (a data file is missing, truncated or corrupt): "
                    f"{causes}"
                ) from None
        self._used.update(requests)
        return {key: t if requests[key] is None else t[0] for key, t in buffers.items()}


class _SliceLoadPlanner(DefaultLoadPlanner):
    """Loads into each plain tensor the box of the saved tensor at offsets[key] with the tensor's size
    (DCP's default planner loads plain tensors only whole)."""

    def __init__(self, offsets: dict[str, tuple[int, ...]]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.offsets = offsets

    def create_local_plan(self) -> LoadPlan:
        items = []
        for key, tensor in self.state_dict.items():
            chunk = ChunkStorageMetadata(offsets=torch.Size(self.offsets[key]), sizes=tensor.size())
            items += create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], [chunk])
        return LoadPlan(items)

    def lookup_tensor(self, index):
        return self.state_dict[index.fqn]  # the read items' offsets are relative to this tensor


def iter_hf_parts(reader: DistCheckpointReader, spec, hf_config: dict):
    """Yields (what, HF name -> tensor): the embedding, each layer, then the final norm and output layer."""
    vocab = hf_config["vocab_size"]

    def unpad(state):  # the checkpoint's vocabulary is padded for TP
        return {
            n: t[:vocab] if n in ("embedding.word_embeddings.weight", "output_layer.weight") else t
            for n, t in state.items()
        }

    hf_shapes = expected_hf_shapes(spec, hf_config)

    def convert(state):
        _check_shapes(reader.dir, spec, hf_config, state, hf_shapes)
        return megatron_full_to_hf(spec, hf_config, state)

    yield "embedding", convert(unpad(reader.outside_layers(first=True)))
    for layer in range(reader.num_layers):
        yield f"layer {layer}", convert(reader.layer(layer))
    yield "output", convert(unpad(reader.outside_layers(first=False)))


def _check_shapes(where: str, spec, hf_config: dict, state: dict, hf_shapes: dict) -> None:
    """Every stored tensor has the shape the recorded config implies; else InvalidMegatronCheckpoint naming
    each key and field. A fused Megatron tensor (q/k/v, gate/up) stacks its HF parts along dim 0.
    (Worked out by hand: meta-tensor ops would import torch's decompositions, ~100 MB of memory.)"""
    wrong = []
    for name, tensor in state.items():
        rule = weight_mapping.rule_for(spec, hf_config, name)
        if not rule.exported:
            continue
        parts = [hf_shapes[n] for n in rule.hf]
        expected = (sum(p[0] for p in parts), *parts[0][1:])
        if tuple(tensor.shape) != expected:
            wrong.append(f"{name} is {tuple(tensor.shape)}, expected {expected}")
    if wrong:
        fields = ", ".join(
            f"{k}={hf_config.get(k)}"
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "vocab_size",
            )
            if k in hf_config
        )
        raise InvalidMegatronCheckpoint(
            f"{where}: stored tensors disagree with the config recorded in "
            f"{SOURCE_FILE_NAME} ({fields}): " + "; ".join(wrong[:10])
        )


class ShardedSafetensorsWriter:
    """Writes HF tensors, in order, into model-0000X-of-0000Y.safetensors files of at most max_shard_bytes
    (a single tensor larger than that gets a file to itself) and model.safetensors.index.json; a single
    file is named model.safetensors, without an index, as transformers does."""

    def __init__(self, out_dir: Path, max_shard_bytes: int):
        self.out_dir, self.max_shard_bytes = Path(out_dir), max_shard_bytes
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffer_bytes = 0
        self._files: list[list[str]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Buffers `tensor` (the caller must not share its storage with another added tensor)."""
        size = tensor.numel() * tensor.element_size()
        if self._buffer and self._buffer_bytes + size > self.max_shard_bytes:
            self._flush()
        self._buffer[name] = tensor
        self._buffer_bytes += size
        self.total_bytes += size

    def close(self) -> list[str]:
        """Writes the last file, names the files and the index; returns the file names."""
        if self._buffer:
            self._flush()
        count = len(self._files)
        names = (
            ["model.safetensors"]
            if count == 1
            else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
        )
        weight_map = {}
        for i, (tensor_names, final) in enumerate(zip(self._files, names)):
            os.replace(self.out_dir / f".part-{i}.safetensors", self.out_dir / final)
            weight_map.update({n: final for n in tensor_names})
        if count > 1:
            index = {
                "metadata": {"total_size": self.total_bytes},
                "weight_map": dict(sorted(weight_map.items())),
            }
            (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return names

    def _flush(self) -> None:
        save_file(
            self._buffer, self.out_dir / f".part-{len(self._files)}.safetensors", metadata={"format": "pt"}
        )
        self._files.append(list(self._buffer))
        self._buffer, self._buffer_bytes = {}, 0


def read_export_source(megatron_dir) -> dict:
    """The checkpoint's SOURCE_FILE, or InvalidMegatronCheckpoint saying what is missing or unreadable."""
    try:
        source = read_source(megatron_dir)
    except FileNotFoundError as error:
        if (Path(megatron_dir).parent / "meta.json").is_file():  # a role folder of an RL checkpoint
            raise InvalidMegatronCheckpoint(
                f"{megatron_dir}: an RL checkpoint written before DistFlow recorded its HF source (no "
                f"{SOURCE_FILE_NAME}); pass the HF model directory it was trained from (the run's model.path), "
                "e.g. tools/convert_megatron_to_hf.py --hf-config MODEL_DIR"
            ) from None
        raise InvalidMegatronCheckpoint(
            f"{error} (or pass --hf-config MODEL_DIR: the HF model it was made from)"
        ) from None
    except AssertionError as error:
        raise InvalidMegatronCheckpoint(str(error)) from None
    except ValueError as error:  # json.JSONDecodeError
        raise InvalidMegatronCheckpoint(
            f"{megatron_dir}/{SOURCE_FILE_NAME} is not valid JSON: {error}"
        ) from None
    missing = [k for k in ("hf_config", "dtype", "expert_layout") if k not in source]
    if missing:
        raise InvalidMegatronCheckpoint(f"{megatron_dir}/{SOURCE_FILE_NAME}: fields {missing} are missing")
    if source.get("value_head"):
        raise InvalidMegatronCheckpoint(
            f"{megatron_dir} is the {source.get('distflow_role', 'critic')}'s checkpoint: its output layer is a "
            "value head, which has no Hugging Face causal-LM counterpart; export the actor's folder"
        )
    return source


def export_source(megatron_dir, hf_source=None) -> tuple[dict, Path]:
    """(source record, folder of the HF non-weight files) for exporting `megatron_dir`: the record the
    checkpoint holds, or, with hf_source (an HF model directory: config.json, tokenizer), one made from it."""
    if hf_source is None:
        assets = Path(megatron_dir) / HF_ASSETS_DIR
        source = read_export_source(megatron_dir)
        if not assets.is_dir():
            raise InvalidMegatronCheckpoint(
                f"{megatron_dir}: no {HF_ASSETS_DIR}/ (the HF config and tokenizer "
                "files tools/convert_hf_to_megatron.py copies next to the checkpoint)"
            )
        return source, assets
    try:
        ckpt = HFCheckpoint(hf_source)
        dtype = str(hf_dtype(ckpt.config)).removeprefix("torch.")
    except (OSError, ValueError, KeyError) as error:
        raise InvalidMegatronCheckpoint(
            f"--hf-config {hf_source}: not a readable HF model directory ({type(error).__name__}: {error})"
        ) from None
    return {"hf_config": ckpt.config, "dtype": dtype, "expert_layout": ckpt.expert_layout}, Path(hf_source)


def _copy_assets(assets: Path, out_dir: Path) -> None:
    """The HF non-weight files (config, tokenizer, generation config) of `assets` into a new out_dir."""
    out_dir.mkdir(parents=True)
    for f in assets.iterdir():
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy2(f, out_dir / f.name)


def source_spec(megatron_dir, hf_config: dict):
    """The family spec of the recorded HF config; errors list the supported architectures and families."""
    try:
        return spec_or_error(hf_config, f"{megatron_dir}/{SOURCE_FILE_NAME} (hf_config)")
    except InvalidHFCheckpoint as error:
        raise InvalidMegatronCheckpoint(str(error)) from None


def export_to_hf(
    megatron_dir,
    out_dir,
    max_shard_bytes: int = 5 * 2**30,
    dtype: str | None = None,
    progress: bool = True,
    hf_source=None,
) -> dict:
    """Writes the HF model directory `out_dir` from a dist checkpoint holding a GPTModel's sharded state:
    one made by checkpoint_import, or a role folder of an RL checkpoint (step_<N>/actor).

    dtype: the safetensors dtype (default: the source checkpoint's). hf_source: an HF model directory
    to take the config and tokenizer from, for a checkpoint that records none (default: the recorded
    ones). Returns a summary (files, bytes, tensors). Runs in one process, without torch.distributed.
    """
    source, assets = export_source(megatron_dir, hf_source)
    hf_config, spec = source["hf_config"], source_spec(megatron_dir, hf_config=source["hf_config"])
    target_dtype = torch_dtype(dtype or source["dtype"], "--dtype")
    out_dir = Path(out_dir)
    reader = DistCheckpointReader(megatron_dir, spec, hf_config)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    _copy_assets(assets, tmp)
    try:
        writer = ShardedSafetensorsWriter(tmp, max_shard_bytes)
        count = 0
        parts = iter_hf_parts(reader, spec, hf_config)
        for what, hf in tqdm(
            parts, total=reader.num_layers + 2, desc="export", unit="part", disable=not progress
        ):
            if source["expert_layout"] == expert_layout.FUSED:
                hf = expert_layout.fuse_layer(spec, hf)
            for name, tensor in hf.items():
                # A copy: gate/up halves and expert slices are views of one loaded tensor, and safetensors
                # refuses tensors that share storage; the layer's loaded tensors are freed after this part.
                writer.add(name, tensor.to(target_dtype, memory_format=torch.contiguous_format, copy=True))
                count += 1
        unused = reader.unused_keys()
        if unused:
            raise InvalidMegatronCheckpoint(
                f"{megatron_dir}: checkpoint keys the {spec.family} mapping does not export: {unused}"
            )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # no half-written directory left behind
        raise
    files = writer.close()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)  # a reader never sees a half-written model
    return {"files": files, "bytes": writer.total_bytes, "tensors": count}


def verify_export(megatron_dir, hf_dir, progress: bool = True, hf_source=None) -> list[str]:
    """Re-reads the written safetensors part by part and compares them with the checkpoint (after the
    same dtype cast). Returns the differences (empty: every tensor equal, none missing or extra)."""
    source, _ = export_source(megatron_dir, hf_source)
    hf_config, spec = source["hf_config"], source_spec(megatron_dir, hf_config=source["hf_config"])
    written = HFCheckpoint(hf_dir)
    written_names = set(written.names())
    reader = DistCheckpointReader(megatron_dir, spec, hf_config)
    problems, seen = [], set()
    parts = iter_hf_parts(reader, spec, hf_config)
    for what, hf in tqdm(
        parts, total=reader.num_layers + 2, desc="verify", unit="part", disable=not progress
    ):
        for name, tensor in hf.items():
            seen.add(name)
            if name not in written_names:
                problems.append(f"{name}: not written")
                continue
            got = written.get(name)
            if got.shape != tensor.shape or not torch.equal(got, tensor.to(got.dtype)):
                problems.append(f"{name} ({what}): differs from the checkpoint")
    problems += [f"{name}: written but not in the checkpoint" for name in sorted(written_names - seen)]
    return problems
