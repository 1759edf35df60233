# Fixes, in megatron/core/transformer/torch_norm.py WrappedTorchNorm.__new__ (the norm of the local layer
# spec when Apex is absent: gpt_layer_specs.LNImpl = WrappedTorchNorm), with sequence_parallel=True:
#     AssertionError: sequence parallel not supported by torch LayerNorm
"""Lets the plain torch LayerNorm/RMSNorm run under sequence parallelism.

Under SP each TP rank normalises its own slice of the sequence with a full, replicated copy of the norm
weights, so nothing in the norm itself changes; what SP needs is that the weights' gradients (each rank
sees only its tokens) are summed over the TP group. Megatron does that for every parameter tagged
`sequence_parallel=True` (finalize_model_grads -> _allreduce_non_tensor_model_parallel_grads), which is what
Apex's and TE's norms do too. So the wrapper builds the norm as Megatron would without SP, then tags its
parameters when SP is on. Applied only when Megatron's local spec uses WrappedTorchNorm (no Apex), on CPU
and GPU alike; with SP off the norm is built exactly as before.
"""

import copy

from ._replace import replace, replaced_by

NAME = "sequence_parallel_torch_norm"


def needed() -> bool:
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return gpt_layer_specs.LNImpl is WrappedTorchNorm


def _tagging_sequence_parallel(original_new):
    def __new__(cls, config, hidden_size, *args, **kwargs):
        if not config.sequence_parallel:
            return original_new(cls, config, hidden_size, *args, **kwargs)
        config_without_sp = copy.copy(config)  # shallow: only the flag the original asserts on changes
        config_without_sp.sequence_parallel = False
        norm = original_new(cls, config_without_sp, hidden_size, *args, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    return staticmethod(__new__)


def is_applied() -> bool:
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return replaced_by(WrappedTorchNorm, "__new__", NAME)


def apply() -> None:
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    replace(WrappedTorchNorm, "__new__", _tagging_sequence_parallel(WrappedTorchNorm.__new__), NAME)
