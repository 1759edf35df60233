"""Where a role's Megatron dist checkpoint is, and the HF source it came from (for export and actor.load).

A model folder is a Megatron dist checkpoint (its `.metadata` index) that records its HF source in
SOURCE_FILE + HF_ASSETS_DIR/: tools/convert_hf_to_megatron.py writes both, and so does every RL checkpoint
for its roles (`record_hf_source`, called at save). `resolve_model_folder` turns what a user passes
(a role folder, a step_<N> folder, a run's checkpoints/ folder or its `latest` file) into the role folder.
RL checkpoints written before the source was recorded hold no SOURCE_FILE: export needs the HF model
directory then (`--hf-config`, the run's model.path).
"""

import json
from pathlib import Path

from distflow.checkpointing.directory import LATEST_FILE, META_FILE, CheckpointDirectory
from distflow.checkpointing.errors import CheckpointError
from distflow.models.checkpoint_import import SOURCE_FILE, write_source

DCP_INDEX = ".metadata"  # torch.distributed.checkpoint's index file, in every dist checkpoint folder
# A role whose step folder lacks its own folder may start from another role's weights: the reference of a
# run without a warm-up is the actor's starting point, so ref.load=step_<N> reads the actor.
_FALLBACK_ROLES = {"ref": ("ref", "actor"), "actor": ("actor",), "critic": ("critic",)}


def resolve_model_folder(path, role: str = "actor", field: str = "--megatron") -> Path:
    """The dist checkpoint folder of `role` that `path` names; CheckpointError says what was expected.

    path: a dist checkpoint folder (the import tool's output or a step_<N>/<role> folder), a step_<N>
    folder (its <role>), a run's checkpoints/ folder or its `latest` file (the step `latest` names).
    field: how the caller names the option, for the messages.
    """
    path = Path(path)
    if path.is_file() and path.name == LATEST_FILE:
        path = path.parent
    if not path.exists():
        raise CheckpointError(f"{field}={path}: no such file or folder")
    if (path / DCP_INDEX).is_file():
        return path
    step = path
    if (path / LATEST_FILE).is_file() and not (path / META_FILE).is_file():
        step = CheckpointDirectory(path).latest()
    if (step / META_FILE).is_file():
        candidates = _FALLBACK_ROLES.get(role, (role,))
        for name in candidates:
            if (step / name / DCP_INDEX).is_file():
                return step / name
        held = sorted(p.name for p in step.iterdir() if (p / DCP_INDEX).is_file())
        raise CheckpointError(
            f"{field}={path}: the checkpoint {step} holds no {' or '.join(candidates)} model "
            f"(it holds {held or 'none'}); pass one of its role folders"
        )
    raise CheckpointError(
        f"{field}={path} is not a Megatron dist checkpoint (no {DCP_INDEX}), nor a DistFlow "
        f"checkpoint (no {META_FILE}: a step_<N> folder; no {LATEST_FILE}: a checkpoints/ "
        "folder); expected the output of tools/convert_hf_to_megatron.py or "
        "<output_dir>/checkpoints[/step_<N>[/actor]]"
    )


def record_hf_source(folder: Path, worker, role: str, step: int) -> None:
    """Writes SOURCE_FILE and HF_ASSETS_DIR/ into a role folder of an RL checkpoint (global rank 0 only), as
    the import tool does: the worker's HF config and non-weight files (tokenizer, generation config),
    so that tools/convert_megatron_to_hf.py exports the folder and `<role>.load` can check its shape."""
    write_source(folder, worker.checkpoint, worker.spec, worker.layout, worker.chunks[0].vocab_size)
    source_file = folder / SOURCE_FILE
    source = json.loads(source_file.read_text())
    # The critic's output layer is its value head: an RL checkpoint says which role wrote it.
    source.update(distflow_role=role, distflow_step=step, value_head=role in ("critic", "reward"))
    source_file.write_text(json.dumps(source, indent=1, sort_keys=True) + "\n")


def read_recorded_source(folder: Path) -> dict | None:
    """The folder's SOURCE_FILE as a dict, or None when it has none (an RL checkpoint of an older DistFlow)."""
    path = Path(folder) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from None
