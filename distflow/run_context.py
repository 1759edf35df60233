"""What the entry point hands a program (the trainer, the smoke run): the config, the validated layouts,
this rank and its device; and the timestamped progress lines they print."""

import os
import time
from dataclasses import dataclass

from distflow.config import DistFlowConfig
from distflow.layout import ClusterLayout

_STARTED = time.monotonic()  # progress lines count from the process start


def progress(message: str) -> None:
    """A timestamped progress line (rank 0 prints; the others stay quiet)."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(
            f"[distflow {time.strftime('%H:%M:%S')} +{time.monotonic() - _STARTED:.1f}s] {message}",
            flush=True,
        )


@dataclass
class RunContext:
    """What a program gets: the config, the validated layouts, this rank, and its device."""

    cfg: DistFlowConfig
    cluster: ClusterLayout
    rank: int
    world_size: int
    local_rank: int
    device: str
    trains: bool = True
    """False on the rollout-only ranks of a disaggregated placement (they build no Megatron worker)."""

    def log(self, message: str) -> None:
        if self.rank == 0:
            progress(message)
