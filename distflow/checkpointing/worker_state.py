"""One MegatronWorker's state: the model as a Megatron distributed checkpoint, plus its optimizer (if it
trains; a forward-only worker, e.g. a reference made from the warmed-up actor, saves its model only).

Every training rank calls save/load together (dist_checkpointing is collective over the default group,
which training_world() makes the training ranks').
The folder holds the chunks' sharded_state_dict (keys as written by tools/convert_hf_to_megatron.py, so
tools/convert_megatron_to_hf.py can read an actor's weights). A regular optimizer's state (Adam moments,
fp32 masters, step) joins the same dist checkpoint. The distributed optimizer's state is written per rank
instead (optimizer_rank<r>.pt: this rank's shard of Adam and of the fp32 masters): Megatron-Core 0.16's
sharded formats for it either need CUDA (fully_reshardable), are refused by its own writer
(fully_sharded_model_space: flattened ranges) or did not resume exactly on CPU (dp_reshardable), and a
resume needs the same layout anyway (checked against meta.json). The LR scheduler's state is small and
identical on every rank: it travels in the per-rank file (see trainer_state.py).
"""

import queue
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from distflow.checkpointing.errors import CheckpointError
from distflow.distributed.training_world import in_training_world
from distflow.models.checkpoint_import import sharded_state_dict


@in_training_world
def save_worker(worker, folder: Path) -> None:
    """Writes `worker`'s model and optimizer shards into `folder` (created by the caller, shared FS)."""
    from megatron.core import dist_checkpointing

    state, distributed = _checkpoint_state(worker, is_loading=False)
    _in_process_write_results()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist_checkpointing.save(state, str(folder))
    if distributed:
        torch.save([_local_state(opt) for opt in distributed], folder / f"optimizer_rank{dist.get_rank()}.pt")


def _in_process_write_results() -> None:
    """Gives Megatron-Core's checkpoint writer a plain queue for its write results before its first save.

    Its default is a multiprocessing Manager queue, made on first use in a *spawned* server process: a fresh
    interpreter that re-imports the trainer's main module (torch, Megatron, SGLang): about 9 s of a 2-core
    machine, and seconds on a GPU node, for a 2 MB checkpoint. A synchronous save (the only kind DistFlow
    makes: dist_checkpointing.save without async_sharded_save) puts and gets its results in this process, so
    a thread-safe in-process queue is all it needs; its forked writer processes report through their own
    queue. Measured on the 2-rank copy-task job: the first save 10 s -> 0.9 s."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if hasattr(filesystem_async, "_results_queue") and filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()


@in_training_world
def load_worker(worker, folder: Path) -> None:
    """Reads this rank's shards of `folder` into `worker`'s chunks and optimizer (same layout as saved)."""
    from megatron.core import dist_checkpointing

    state, distributed = _checkpoint_state(worker, is_loading=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = dist_checkpointing.load(state, str(folder))
    if len(worker.chunks) == 1:
        worker.chunks[0].load_state_dict(loaded["model"], strict=True)
    else:
        for i, chunk in enumerate(worker.chunks):
            chunk.load_state_dict(loaded["model"][f"model{i}"], strict=True)
    if distributed:
        path = folder / f"optimizer_rank{dist.get_rank()}.pt"
        if not path.is_file():
            raise CheckpointError(
                f"{folder}: no {path.name} (rank {dist.get_rank()}'s distributed-optimizer shard)"
            )
        for opt, saved in zip(distributed, torch.load(path, weights_only=False)):
            _load_local_state(opt, saved)
    elif worker.trains:
        worker.optimizer.load_state_dict(loaded["optimizer"])


def _checkpoint_state(worker, is_loading: bool) -> tuple[dict, list]:
    """The sharded state the dist checkpoint holds (the model, plus a regular optimizer's state) and the
    worker's distributed optimizers, whose shards are written per rank instead."""
    model = sharded_state_dict(worker.chunks)
    state = {"model": model}
    distributed = _distributed_optimizers(worker)
    if worker.trains and not distributed:
        state["optimizer"] = worker.optimizer.sharded_state_dict(model, is_loading=is_loading)
    return state, distributed


def _distributed_optimizers(worker) -> list:
    """The worker's Megatron DistributedOptimizers (inside a ChainedOptimizer or alone); [] for others."""
    if not worker.trains:
        return []
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return [
        o
        for o in getattr(worker.optimizer, "chained_optimizers", [worker.optimizer])
        if isinstance(o, DistributedOptimizer)
    ]


def _local_state(opt) -> dict:
    """This rank's shard: torch Adam's state (moments, step) and the fp32 masters of low-precision params
    (fp32 params are their own masters: the model checkpoint holds them)."""
    return {
        "adam": opt.optimizer.state_dict(),
        "fp32_masters": [[p.detach().clone() for p in group] for group in opt.shard_fp32_from_float16_groups],
    }


def _load_local_state(opt, saved: dict) -> None:
    opt.optimizer.load_state_dict(saved["adam"])
    with torch.no_grad():
        for group, saved_group in zip(opt.shard_fp32_from_float16_groups, saved["fp32_masters"]):
            for param, value in zip(group, saved_group):
                param.copy_(value)
