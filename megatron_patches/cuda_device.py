# Fixes, in ~200 Megatron call sites (first hit: distributed/param_and_grad_buffer.py _ParamAndGradBuffer
# __init__, `torch.zeros(..., device=torch.cuda.current_device())` when DDP allocates its grad buffer;
# later GlobalMemoryBuffer.get_tensor in attention, p2p_communication, tensor_parallel.mappings):
#     torch.cuda.current_device()  ->  AssertionError: Torch not compiled with CUDA enabled
# and the same error from torch.cuda.synchronize() (timers, optimizer, checkpointing).
"""Makes torch.cuda.current_device() name the CPU and torch.cuda.synchronize() a no-op, CPU-only.

Megatron uses current_device() as "where tensors go" (device=..., .to(...)), so the CPU device is the
faithful answer on a machine whose tensors all live on the CPU. This has to be global (the calls go through
the torch.cuda module from dozens of Megatron files), but it is applied only when CUDA is unavailable, where
the originals can do nothing but raise: no call that worked before behaves differently.
"""

import torch

from ._conditions import cuda_missing
from ._replace import replace, replaced_by

NAME = "cuda_device"
needed = cuda_missing


def _cpu_current_device() -> torch.device:
    return torch.device("cpu")


def _synchronize_nothing(device=None) -> None:
    """CPU ops complete before they return: there is nothing to wait for."""


def is_applied() -> bool:
    return replaced_by(torch.cuda, "current_device", NAME)


def apply() -> None:
    replace(torch.cuda, "current_device", _cpu_current_device, NAME)
    replace(torch.cuda, "synchronize", _synchronize_nothing, NAME)
