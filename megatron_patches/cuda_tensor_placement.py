# Fixes hard-coded CUDA placement in Megatron's tensor factories, each
#     AssertionError: Torch not compiled with CUDA enabled
# at (0.16.1 line numbers):
#     optimizer/optimizer.py:907 FP32Optimizer.__init__: torch.tensor([1.0], ..., device='cuda')
#     optimizer/clip_grads.py:103 get_grad_norm_fp32: torch.zeros(1, dtype=torch.int, device='cuda')
#     utils.py:1207 local_multi_tensor_l2_norm: torch.tensor([...], ..., device="cuda")
#     pipeline_parallel/schedules.py:596 forward_backward_no_pipelining: torch.zeros([], ..., device="cuda")
#     transformer/utils.py:35 get_default_causal_mask: torch.ones(sq, sq, device="cuda")
"""Inside the few Megatron modules that hard-code device="cuda", tensor factories place tensors on the CPU.

Targeted, not global: each listed module sees `torch` through a view (_torch_view.py) whose factories
(torch.zeros, torch.tensor, ...) map a CUDA device (or a bare int ordinal) to the CPU; every other
attribute is torch's own, and the rest of the process never sees the view. Applied only without CUDA,
where a CUDA device argument can do nothing but raise.
"""

import functools
import importlib

import torch

from ._conditions import cuda_missing
from ._replace import replaced_by
from ._torch_view import install_torch_view

NAME = "cuda_tensor_placement"
needed = cuda_missing

# Megatron modules that build tensors with a hard-coded CUDA device on the paths DistFlow runs.
MODULES_WITH_CUDA_FACTORIES = (
    "megatron.core.optimizer.optimizer",  # FP32Optimizer/MixedPrecisionOptimizer scale and found-inf buffers
    "megatron.core.optimizer.clip_grads",  # grad-norm and zero-count buffers
    "megatron.core.pipeline_parallel.schedules",  # total_num_tokens counter
    "megatron.core.utils",  # local_multi_tensor_l2_norm, the grad-norm fallback without Apex/TE
    "megatron.core.transformer.utils",  # get_default_causal_mask (attention without an explicit mask)
)

_FACTORIES = (
    "tensor",
    "as_tensor",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "rand",
    "randn",
    "randint",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
)


def _is_cuda_device(device) -> bool:
    if isinstance(device, bool):
        return False
    if isinstance(device, int):  # a bare int means a CUDA ordinal to torch
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


def _placing_on_cpu(factory):
    @functools.wraps(factory)
    def factory_on_cpu(*args, **kwargs):
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return factory_on_cpu


def is_applied() -> bool:
    return replaced_by(importlib.import_module(MODULES_WITH_CUDA_FACTORIES[0]), "torch", NAME)


def apply() -> None:
    factories = {name: _placing_on_cpu(getattr(torch, name)) for name in _FACTORIES}
    install_torch_view(
        MODULES_WITH_CUDA_FACTORIES, factories, "tensor factories place CUDA tensors on the CPU", NAME
    )
