"""Starts a role's model from a Megatron dist checkpoint (`<role>.load`) instead of model.path's safetensors.

The checkpoint is the import tool's output (tools/convert_hf_to_megatron.py) or an RL checkpoint's role
folder (or step folder, or checkpoints/ folder: distflow.checkpointing.model_folder resolves them); it
may have been saved at any layout (dist_checkpointing reshards). model.path still gives the architecture
and the tokenizer, so the checkpoint must hold that model: its recorded HF config and its tensors' global
shapes are compared with the model built from model.path before anything is read, and a difference is a
ValueError naming the field or tensor. Only the model is read (an RL checkpoint's optimizer state stays:
the run starts a fresh optimizer, as from HF weights).
"""

import warnings
from pathlib import Path

import torch.distributed.checkpoint as dcp

from distflow.checkpointing.model_folder import read_recorded_source, resolve_model_folder
from distflow.checkpointing.trainer_state import MODEL_FIELDS
from distflow.models.checkpoint_import import sharded_state_dict

_HEAD_PREFIX = "output_layer."


def load_dist_checkpoint_weights(
    chunks: list, path, role: str, hf_config: dict, model_path, keep_fresh_head: bool = False
) -> Path:
    """Reads this rank's shards of the checkpoint `path` into the role's chunks (GPTModel, unwrapped);
    collective over the training ranks. Returns the folder read.

    keep_fresh_head: the critic's value head stays as initialised when the checkpoint holds a language-model
    output layer (or none, tied embeddings) in its place; a critic checkpoint's head is loaded.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    field = f"{role}.load"
    folder = resolve_model_folder(path, role, field=field)
    _check_recorded_model(folder, field, hf_config, model_path)
    stored = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    state = sharded_state_dict(chunks)
    if keep_fresh_head:
        state = _without_head_unless_stored(state, stored)
    wanted = [sh for sh in nested_values(state) if isinstance(sh, ShardedTensor)]
    problems = []
    for sh in wanted:
        if sh.key not in stored:
            problems.append(f"{sh.key}: not in the checkpoint")
            continue
        have, want = tuple(stored[sh.key].size), tuple(sh.global_shape)
        # Embedding and output layer rows are the vocabulary padded for the saved TP size: only they may differ.
        if have != want and not (sh.allow_shape_mismatch and have[1:] == want[1:]):
            problems.append(f"{sh.key}: {have} in the checkpoint, {want} for model.path's config")
    if problems:
        raise ValueError(
            f"{field}={folder} does not hold the model of model.path={model_path}: "
            + "; ".join(problems[:8])
            + (f" (+{len(problems) - 8} more)" if len(problems) > 8 else "")
            + ". Convert model.path with tools/convert_hf_to_megatron.py, or set model.path to the "
            "model the checkpoint was trained from"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = dist_checkpointing.load(state, str(folder))
    # The checkpoint's common (non-sharded) state joins the result, e.g. an RL checkpoint's optimizer groups.
    loaded = {k: v for k, v in loaded.items() if k in state}
    parts = [loaded] if len(chunks) == 1 else [loaded[f"model{i}"] for i in range(len(chunks))]
    for chunk, part in zip(chunks, parts):
        missing, unexpected = chunk.load_state_dict(part, strict=False)
        missing = [
            k
            for k in missing
            if not k.endswith("_extra_state") and not (keep_fresh_head and k.startswith(_HEAD_PREFIX))
        ]
        if missing or unexpected:
            raise RuntimeError(
                f"{field}={folder}: loading left parameters unset {missing} or gave unknown ones {unexpected}"
            )
    return folder


def _check_recorded_model(folder: Path, field: str, hf_config: dict, model_path) -> None:
    """The checkpoint's recorded HF config (when it has one) names the same architecture as model.path's."""
    source = read_recorded_source(folder)
    if source is None or "hf_config" not in source:
        return  # an older RL checkpoint: the tensor shapes are still compared
    recorded = source["hf_config"]
    diff = [
        f"{k}={recorded.get(k)} (model.path: {hf_config.get(k)})"
        for k in MODEL_FIELDS
        if recorded.get(k) != hf_config.get(k)
    ]
    if diff:
        raise ValueError(
            f"{field}={folder} was made from another model than model.path={model_path}: "
            + ", ".join(diff)
            + ". Set model.path to the HF model the checkpoint came from "
            f"(recorded: {source.get('hf_source_dir', 'unknown')})"
        )


def _without_head_unless_stored(state: dict, stored: dict) -> dict:
    """The state without the output layer's entries whose key the checkpoint lacks or stores with another
    shape (a language model's vocabulary output, where the critic has its one-column value head)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    def keep(name, value):
        if not name.startswith(_HEAD_PREFIX) or not isinstance(value, ShardedTensor):
            return True
        return value.key in stored and tuple(stored[value.key].size) == tuple(value.global_shape)

    def strip(d):  # one chunk's flat dict, or {"model0": ..., "model1": ...} with VPP
        return {
            k: strip(v) if isinstance(v, dict) else v
            for k, v in d.items()
            if isinstance(v, dict) or keep(k, v)
        }

    return strip(state)
