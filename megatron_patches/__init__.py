"""Lets Megatron-Core 0.16.1 run its real code on CPU over gloo (and fixes one upstream bug without TE).

Call `megatron_patches.apply()` in every process that runs Megatron, before it builds models or optimizers
(it imports the Megatron modules it patches). Each patch is a module of its own whose opening comment quotes
the failure it fixes, with the contract NAME, needed(), is_applied(), apply(); README.md tabulates them.
A patch is applied only where its failure would occur (the CUDA ones only without CUDA).
"""

from . import (
    cuda_device,
    cuda_rng_tracker,
    cuda_streams,
    cuda_tensor_methods,
    cuda_tensor_placement,
    moe_alltoall_split_sizes,
    moe_te_general_gemm,
    sequence_parallel_torch_norm,
)

# The patches are independent of each other; the order is only the order apply() reports them in.
PATCHES = (
    cuda_device,
    cuda_tensor_placement,
    cuda_tensor_methods,
    cuda_streams,
    cuda_rng_tracker,
    moe_alltoall_split_sizes,
    moe_te_general_gemm,
    sequence_parallel_torch_norm,
)


def apply() -> list[str]:
    """Applies every patch this process needs; returns the names of the patches now in effect.

    A second call finds each patch already in place (marked on the replaced objects) and changes nothing;
    it returns the same names.
    """
    active = []
    for patch in PATCHES:
        if not patch.needed():
            continue
        if not patch.is_applied():
            patch.apply()
        active.append(patch.NAME)
    return active
