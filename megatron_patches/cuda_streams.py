# Fixes, in megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher.__init__:
#     MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = torch.cuda.Stream()
#         RuntimeError: torch.cuda.Stream requires CUDA support
# and, after it, its use of torch.cuda.current_stream() / torch.cuda.stream() / Stream.record_event() in
# _maybe_dtoh_and_synchronize (device-to-host copies of the split sizes on a side stream).
"""Gives the MoE alltoall dispatcher CPU stand-ins for CUDA streams and events.

On the CPU every op has finished when it returns, so a stream is only a label and waiting on it or on an
event is a no-op. Targeted: only the token dispatcher module sees the stand-ins (through a torch view
whose `cuda` attribute overrides Stream, Event, stream and current_stream); torch.cuda stays untouched for
everyone else. Applied only without CUDA, where the real classes cannot be constructed.
"""

import contextlib
import importlib

import torch

from ._conditions import cuda_missing
from ._replace import replaced_by
from ._torch_view import TorchView, install_torch_view

NAME = "cuda_streams"
needed = cuda_missing

MODULES_USING_CUDA_STREAMS = ("megatron.core.transformer.moe.token_dispatcher",)


class CpuEvent:
    """Marks a point in a CPU "stream": everything before it has already run."""

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuStream:
    """A CUDA stream's interface with nothing to order: CPU ops run to completion in program order."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None) -> CpuEvent:
        return event or CpuEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


_DEFAULT_STREAM = CpuStream()


def _current_stream(device=None) -> CpuStream:
    return _DEFAULT_STREAM


def _on_stream(stream):
    return contextlib.nullcontext()


def is_applied() -> bool:
    return replaced_by(importlib.import_module(MODULES_USING_CUDA_STREAMS[0]), "torch", NAME)


def apply() -> None:
    cuda_with_cpu_streams = TorchView(
        torch.cuda,
        {
            "Stream": CpuStream,
            "Event": CpuEvent,
            "current_stream": _current_stream,
            "stream": _on_stream,
        },
        "CPU stand-ins for CUDA streams",
    )
    install_torch_view(
        MODULES_USING_CUDA_STREAMS,
        {"cuda": cuda_with_cpu_streams},
        "torch.cuda with CPU stand-ins for streams and events",
        NAME,
    )
