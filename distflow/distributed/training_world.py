"""The training world: the ranks that run Megatron, as Megatron sees them.

Colocated placement: every rank trains, and the training world is the job's world; nothing here does
anything. Disaggregated placement: only placement.train_ranks (the first ranks of the job) train; the
others host rollout engines. Megatron-Core 0.16 takes the default process group to be its world (its
group construction, the optimizer's parameter-group agreement and distributed checkpointing all run
collectives over it), so on a training rank every Megatron call runs inside `training_world()`, which makes
a process group of the training ranks the default for its duration. Training ranks are numbered from 0,
so a rank's number is the same in both worlds and every group Megatron builds names the job's ranks.
Everything else (the data coordinator, the weight sync, metrics, checkpoint barriers) stays on the job's
world, where the rollout ranks take part.
"""

import contextlib
import functools

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

_train_group = None  # this rank's process group of the training ranks (disaggregated placement only)
_depth = 0  # nesting of training_world() (a worker method calling another)


def set_up(placement) -> bool:
    """Collective over the job: builds the training ranks' group when they are not the whole job.
    Returns whether this rank trains."""
    global _train_group
    _train_group = None
    if len(placement.train_ranks) == dist.get_world_size():
        return True
    group = dist.new_group(list(placement.train_ranks))
    if dist.get_rank() in placement.train_ranks:
        _train_group = group
        return True
    return False


@contextlib.contextmanager
def training_world():
    """Makes the training ranks' group the default process group (no-op when every rank trains)."""
    global _depth
    if _train_group is None or _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    job_world = c10d._get_default_group()
    c10d._update_default_pg(_train_group)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        c10d._update_default_pg(job_world)


def in_training_world(fn):
    """Decorator: runs `fn` inside training_world()."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with training_world():
            return fn(*args, **kwargs)

    return wrapped


def align_group_names() -> None:
    """Collective over the job. torch names the groups it creates by a per-process counter; the groups
    Megatron built inside training_world() advanced it on training ranks only. Every rank continues from
    the highest count, so groups created by the whole job afterwards get the same name on every rank."""
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, c10d._world.group_count)  # objects: works over NCCL and gloo alike
    c10d._world.group_count = max(counts)
