"""One MegatronWorker's state as a Megatron distributed checkpoint: model chunks + optimizer (if it trains;
a forward-only worker, e.g. a reference made from the warmed-up actor, saves its model only).

Every rank of the job calls save/load together (dist_checkpointing is collective over the default group).
The folder holds the chunks' sharded_state_dict (keys as written by tools/convert_hf_to_megatron.py, so
tools/convert_megatron_to_hf.py can read an actor's weights) and the optimizer's sharded state (Adam
moments, fp32 masters, step). The LR scheduler's state is small and identical on every rank: it travels in
the per-rank file instead (see trainer_state.py).
"""
import warnings
from pathlib import Path

from distflow.models.checkpoint_import import sharded_state_dict


def save_worker(worker, folder: Path) -> None:
    """Writes `worker`'s model and optimizer shards into `folder` (created by the caller, shared FS)."""
    from megatron.core import dist_checkpointing

    model = sharded_state_dict(worker.chunks)
    state = {"model": model}
    if worker.trains:
        state["optimizer"] = worker.optimizer.sharded_state_dict(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist_checkpointing.save(state, str(folder))


def load_worker(worker, folder: Path) -> None:
    """Reads this rank's shards of `folder` into `worker`'s chunks and optimizer (same layout as saved)."""
    from megatron.core import dist_checkpointing

    model = sharded_state_dict(worker.chunks)
    state = {"model": model}
    if worker.trains:
        state["optimizer"] = worker.optimizer.sharded_state_dict(model, is_loading=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = dist_checkpointing.load(state, str(folder))
    if len(worker.chunks) == 1:
        worker.chunks[0].load_state_dict(loaded["model"], strict=True)
    else:
        for i, chunk in enumerate(worker.chunks):
            chunk.load_state_dict(loaded["model"][f"model{i}"], strict=True)
    if worker.trains:
        worker.optimizer.load_state_dict(loaded["optimizer"])
