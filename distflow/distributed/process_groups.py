"""Process-group set-up for one rank: torch.distributed (gloo on CPU, NCCL on GPU) and Megatron's groups.

Called by every rank of a torchrun/srun job; the only inputs are the rank's environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and a validated ClusterLayout, so all ranks agree on
every group without talking to a coordinator first.
"""

import datetime
import os
import socket
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distflow.distributed import training_world
from distflow.distributed.store_client import attempt_store
from distflow.layout import LayoutError, ParallelLayout, Placement


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environ(cls) -> "RankEnv":
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        )


def resolve_device(requested: str) -> str:
    """'auto' becomes 'cuda' when a GPU is visible, else 'cpu'; asking for cuda without one is an error."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "trainer.device=cuda but no CUDA device is visible; use trainer.device=auto or cpu"
        )
    return requested


def init_process_group(device: str, timeout_s: int) -> RankEnv:
    """Initialises the default group (idempotent). On CPU also applies the Megatron-Core CPU patches."""
    env = RankEnv.from_environ()
    if device == "cpu":
        import megatron_patches  # noqa: PLC0415 - patches Megatron-Core (heavy): only once process groups are made

        megatron_patches.apply()
    else:
        torch.cuda.set_device(env.local_rank)
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:  # a plain single-process run, outside torchrun
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend="gloo" if device == "cpu" else "nccl",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            store=_attempt_store(env, timeout),
        )
    return env


def _attempt_store(env: RankEnv, timeout: datetime.timedelta):
    """Under torchrun, the key-value store of this restart attempt: the agent's store (it lives across
    restarts) with keys under the attempt's number. The default env:// store shares the keys of every
    attempt, so a restarted rank can read a dead rank's address from the failed attempt before its
    successor writes its own, and gloo then fails with 'connectFullMesh ... Connection refused' (torchrun
    --max-restarts never resumed). None outside torchrun: env:// as usual."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return attempt_store(timeout, world_size=env.world_size)


def restarts() -> dict[str, int]:
    """How often this job was started again before this attempt: by torchrun (--max-restarts, within one
    allocation) and by SLURM (a requeued job, the shipped sbatch wrapper's; SLURM counts them)."""

    def count(name: str) -> int:
        value = os.environ.get(name, "0")
        return int(value) if value.isdigit() else 0

    return {"torchrun": count("TORCHELASTIC_RESTART_COUNT"), "slurm": count("SLURM_RESTART_COUNT")}


def initialize_megatron_groups(layout: ParallelLayout, placement: Placement, timeout_s: int) -> bool:
    """Creates Megatron's TP/PP/DP/CP/EP groups for `layout` over the training ranks (collective over the job:
    rollout-only ranks of a disaggregated placement take part in creating the groups' group, not Megatron's).
    Returns whether this rank trains."""
    from megatron.core import parallel_state

    if len(placement.train_ranks) != layout.world_size:
        raise LayoutError(
            f"the layout covers {layout.world_size} ranks but the placement trains on "
            f"{len(placement.train_ranks)}"
        )
    if placement.world_size != dist.get_world_size():
        raise LayoutError(
            f"the placement covers {placement.world_size} ranks but the job has {dist.get_world_size()}"
        )
    trains = training_world.set_up(placement)
    if trains:
        with training_world.training_world():
            if parallel_state.model_parallel_is_initialized():
                parallel_state.destroy_model_parallel()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                parallel_state.initialize_model_parallel(
                    tensor_model_parallel_size=layout.tp,
                    pipeline_model_parallel_size=layout.pp,
                    virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
                    context_parallel_size=layout.cp,
                    expert_model_parallel_size=layout.ep,
                    expert_tensor_parallel_size=layout.etp,
                    # Megatron builds timedelta(minutes=...): a fraction keeps the job's timeout in seconds
                    # (whole minutes made trainer.dist_timeout_s=30 wait 60 s on a frozen rank).
                    distributed_timeout_minutes=timeout_s / 60,
                )
    if len(placement.train_ranks) != dist.get_world_size():  # Megatron's groups exist on some ranks only
        training_world.align_group_names()
    return trains


def destroy_process_group() -> None:
    """Leaves the job's process groups at the end of a run (nothing when this process never joined any)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int, trains: bool = True) -> None:
    """Same seed on every rank; Megatron's tracker gives TP ranks their own streams where it needs them
    (training ranks only: it reads their Megatron groups)."""
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.manual_seed(seed)
    if trains:
        model_parallel_cuda_manual_seed(seed)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
