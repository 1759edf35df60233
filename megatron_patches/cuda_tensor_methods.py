# Fixes Megatron code that checks or moves CPU tensors as if they were CUDA tensors:
#     optimizer/clip_grads.py clip_grad_by_total_norm_fp32: assert param.grad.type() == 'torch.cuda.FloatTensor'
#         AssertionError
#     optimizer/optimizer.py Float16OptimizerWithFloat16Params.__init__ (bf16/fp16) and
#     optimizer/distrib_optimizer.py DistributedOptimizer._build_model_and_main_param_groups:
#         TypeError: Wrapped parameters must be one of torch.cuda.FloatTensor, torch.cuda.HalfTensor, or
#         torch.cuda.BFloat16Tensor. Received torch.FloatTensor
#     models/common/language_module/language_module.py setup_embeddings_and_output_layer (tied embeddings
#     with PP > 1): weight.data = weight.data.cuda()  ->  AssertionError: Torch not compiled with CUDA enabled
"""While the few Megatron functions above run, CPU tensors answer type() with CUDA names and .cuda() with self.

Tensor methods cannot be rebound per module, so this is scoped in time instead: each listed function is
wrapped so that Tensor.type/Tensor.cuda are swapped in on entry and restored on exit (nesting-safe). Outside
those calls every tensor behaves as torch defines. The swap is process-wide while it lasts; the wrapped
functions are set-up and optimizer-step code that Megatron runs on the training thread, with no other
thread expected to call Tensor.type or .cuda at the same time. Applied only without CUDA.
"""

import contextlib
import functools
import importlib

import torch

from ._conditions import cuda_missing
from ._replace import replace, replaced_by

NAME = "cuda_tensor_methods"
needed = cuda_missing

# (module, class or None, function): Megatron functions that need CPU tensors to pass as CUDA tensors.
FUNCTIONS_EXPECTING_CUDA_TENSORS = (
    ("megatron.core.optimizer.clip_grads", None, "clip_grad_by_total_norm_fp32"),
    ("megatron.core.optimizer.optimizer", "Float16OptimizerWithFloat16Params", "__init__"),
    (
        "megatron.core.optimizer.distrib_optimizer",
        "DistributedOptimizer",
        "_build_model_and_main_param_groups",
    ),
    (
        "megatron.core.models.common.language_module.language_module",
        "LanguageModule",
        "setup_embeddings_and_output_layer",
    ),
)
# Modules that imported a listed function by name: their binding must point at the wrapper too.
IMPORTED_BY_NAME = {"clip_grad_by_total_norm_fp32": ("megatron.core.optimizer.optimizer",)}

_original_type = torch.Tensor.type  # both inherited from torch._C.TensorBase
_depth = 0


def _type_named_as_cuda(self, dtype=None, non_blocking=False, **kwargs):
    if dtype is not None or kwargs or self.is_cuda:
        return _original_type(self, dtype, non_blocking, **kwargs)
    return _original_type(self).replace(
        "torch.", "torch.cuda.", 1
    )  # torch.FloatTensor -> torch.cuda.FloatTensor


def _stay_on_cpu(self, device=None, non_blocking=False, **kwargs):
    return self


@contextlib.contextmanager
def cpu_tensors_acting_as_cuda():
    """Shadows Tensor.type/.cuda on torch.Tensor for the duration; deleting the shadows restores torch's own."""
    global _depth
    if _depth == 0:
        torch.Tensor.type, torch.Tensor.cuda = _type_named_as_cuda, _stay_on_cpu
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            del torch.Tensor.type, torch.Tensor.cuda


def _acting_as_cuda(function):
    @functools.wraps(function)
    def run_with_cpu_tensors_acting_as_cuda(*args, **kwargs):
        with cpu_tensors_acting_as_cuda():
            return function(*args, **kwargs)

    return run_with_cpu_tensors_acting_as_cuda


def _owner(module_name, class_name):
    module = importlib.import_module(module_name)
    return getattr(module, class_name) if class_name else module


def is_applied() -> bool:
    module_name, class_name, function_name = FUNCTIONS_EXPECTING_CUDA_TENSORS[0]
    return replaced_by(_owner(module_name, class_name), function_name, NAME)


def apply() -> None:
    for module_name, class_name, function_name in FUNCTIONS_EXPECTING_CUDA_TENSORS:
        owner = _owner(module_name, class_name)
        attribute = owner.__dict__[function_name]
        if isinstance(attribute, classmethod):
            replace(owner, function_name, classmethod(_acting_as_cuda(attribute.__func__)), NAME)
            continue
        wrapped = _acting_as_cuda(attribute)
        replace(owner, function_name, wrapped, NAME)
        for importer in IMPORTED_BY_NAME.get(function_name, ()):
            replace(importlib.import_module(importer), function_name, wrapped, NAME)
