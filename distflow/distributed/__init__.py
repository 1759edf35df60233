"""What each rank sets up before it trains or generates: the default process group (gloo/NCCL) and Megatron's
groups from a layout (process_groups), the training world of a disaggregated placement (training_world),
and the library warnings it silences (library_noise)."""

from distflow.distributed.process_groups import (
    RankEnv,
    destroy_process_group,
    init_process_group,
    initialize_megatron_groups,
    resolve_device,
    restarts,
    seed_everything,
)

__all__ = [
    "RankEnv",
    "destroy_process_group",
    "init_process_group",
    "initialize_megatron_groups",
    "resolve_device",
    "restarts",
    "seed_everything",
]
