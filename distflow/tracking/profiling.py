"""trainer.profile_steps: a torch.profiler trace of chosen RL steps, one per rank and step.

Each listed step runs inside torch.profiler.profile (CPU activity, and CUDA when a GPU is in use); when the
step ends, torch.profiler.tensorboard_trace_handler writes a Chrome trace (JSON) to
<output_dir>/profile/rank<k>/rank<k>_step<N>.<id>.pt.trace.json: open it in chrome://tracing or Perfetto, or
point TensorBoard's profiler plugin at <output_dir>/profile/rank<k>. Steps not listed run unprofiled, at no
cost.
"""

from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler


class StepProfiler:
    """`with profiler.step(n): ...` profiles step n when n is in `steps`, and does nothing otherwise.

    steps: the RL steps to trace (trainer.profile_steps); output_dir: the run's output folder; rank: this
    process's global rank (each rank writes its own folder); cuda: also record CUDA kernels.
    """

    def __init__(self, steps, output_dir: str | Path, rank: int, cuda: bool = False):
        self.steps = frozenset(int(s) for s in steps)
        self.trace_dir = Path(output_dir) / "profile" / f"rank{rank}"
        self.rank = rank
        self.cuda = cuda

    @contextmanager
    def step(self, step: int):
        if step not in self.steps:
            yield
            return

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        handler = tensorboard_trace_handler(str(self.trace_dir), worker_name=f"rank{self.rank}_step{step}")
        with profile(activities=activities, record_shapes=True, on_trace_ready=handler):
            yield
        if self.cuda:
            torch.cuda.synchronize()

    def traces(self) -> list[Path]:
        """The trace files written so far, oldest first."""
        return sorted(self.trace_dir.glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime)
