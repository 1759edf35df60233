# Fixes, in megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher.token_dispatch
# (EP > 1) -> tensor_parallel/mappings.py _AllToAll.forward -> torch.distributed.all_to_all_single:
#     TypeError: all_to_all_single(): incompatible function arguments. ...
#     output_split_sizes: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] ...
# The split sizes arrive as tensors: moe_utils.maybe_move_tensor_to_cpu(t, as_numpy=True) converts only
# CUDA tensors (`if torch.is_tensor(tensor) and tensor.is_cuda`), so on CPU they are never made numpy.
"""Lets the MoE alltoall dispatcher's split sizes become numpy arrays when they are already on the CPU.

Targeted: only the dispatcher's binding of maybe_move_tensor_to_cpu is replaced, by a wrapper that converts
CPU tensors asked for `as_numpy` (copying, as the device-to-host copy does on GPU) and hands everything
else to Megatron's own function. Applied only without CUDA; with CUDA the split sizes are CUDA tensors.
"""

import torch

from ._conditions import cuda_missing
from ._replace import replace, replaced_by

NAME = "moe_alltoall_split_sizes"
needed = cuda_missing


def _token_dispatcher():
    from megatron.core.transformer.moe import token_dispatcher

    return token_dispatcher


def _also_cpu_tensors_to_numpy(original):
    def maybe_move_tensor_to_cpu(tensor, as_numpy: bool = False, record_stream: bool = False):
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy().copy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    return maybe_move_tensor_to_cpu


def is_applied() -> bool:
    return replaced_by(_token_dispatcher(), "maybe_move_tensor_to_cpu", NAME)


def apply() -> None:
    dispatcher = _token_dispatcher()
    wrapped = _also_cpu_tensors_to_numpy(dispatcher.maybe_move_tensor_to_cpu)
    replace(dispatcher, "maybe_move_tensor_to_cpu", wrapped, NAME)
