"""What every check of the GPU check reads: the device, the world of one rank, the sizes, the time left."""

import glob
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from distflow.layout import ParallelLayout, Placement

GIB = 2**30


@dataclass
class CheckContext:
    device: str
    """"cuda" or "cpu" (the --cpu-smoke run)."""
    work_dir: Path
    deadline: float
    """time.monotonic() by which every check must be done (--budget-s)."""
    sizes: list
    seq_len: int
    rows: int
    max_tokens: int
    repeats: int
    bucket_mb: float
    peak_tflops: float | None = None
    timeout_s: float = 300
    layout: ParallelLayout = field(default_factory=lambda: ParallelLayout.for_world(1))
    placement: Placement = field(default_factory=lambda: Placement.create("colocated", 1, 1))
    state: dict = field(default_factory=dict)
    """What one check leaves to the next (the 1B actor for the staging and memory checks)."""

    @property
    def torch_device(self) -> torch.device:
        return (
            torch.device("cuda", torch.cuda.current_device())
            if self.device == "cuda"
            else torch.device("cpu")
        )

    @property
    def dtype(self) -> str:
        """bf16 on GPU; fp32 on CPU (no fast bf16 matmul there), as DistFlow's CPU runs use."""
        return "bfloat16" if self.device == "cuda" else "float32"

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, repeats: int, device: torch.device) -> tuple[float, object]:
    """(median seconds of `repeats` calls, the last call's result); the device is idle before and after each."""
    times, result = [], None
    for _ in range(repeats):
        synchronize(device)
        tic = time.perf_counter()
        result = fn()
        synchronize(device)
        times.append(time.perf_counter() - tic)
    return sorted(times)[len(times) // 2], result


def memory_reading(device: torch.device) -> dict:
    """This process's allocated and reserved CUDA memory and the device's used memory (all processes), GiB. On
    CPU: the torch shared-memory files this process created (the CPU staging buffers live there), MiB."""
    if device.type != "cuda":
        files = glob.glob(f"/dev/shm/torch_{os.getpid()}_*")  # torch's file_system sharing names them so
        return {"cuda": "skipped: needs CUDA", "shared_memory_mib": sum(_size(f) for f in files) / 2**20}
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated_gib": torch.cuda.memory_allocated(device) / GIB,
        "reserved_gib": torch.cuda.memory_reserved(device) / GIB,
        "device_used_gib": (total - free) / GIB,
    }


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # unlinked since the listing
        return 0
