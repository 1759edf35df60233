"""Lets Megatron-Core 0.16.1 run its real code on CPU over gloo (and fixes one upstream bug without TE).

Call `megatron_patches.apply()` once per process after importing torch and before building Megatron models.
Each patch is a module of its own whose opening comment quotes the failure it fixes; README.md tabulates
them. A patch is applied only where its failure would occur (CUDA patches only without CUDA), and apply()
is idempotent.
"""
from . import cuda_device, cuda_rng_tracker, cuda_tensor_methods, cuda_tensor_placement

# Order matters only where a patch builds on another; cuda_device comes first because several later
# patches hand out torch.cuda.current_device() as the CPU.
PATCHES = (cuda_device, cuda_rng_tracker, cuda_tensor_placement, cuda_tensor_methods)


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
