# Fixes, in megatron/core/tensor_parallel/random.py:
#     model_parallel_cuda_manual_seed -> CudaRNGStatesTracker.add -> torch.cuda.get_rng_state()
#         AssertionError: Torch not compiled with CUDA enabled
# Skipping the seed call is no way out: attention forks the tracker even with dropout 0
# (TransformerLayer -> DotProductAttention: `Exception: cuda rng state model-parallel-rng is not added`).
"""Backs Megatron's CUDA RNG tracker with the CPU generator, CPU-only.

On a CPU machine every random op draws from torch's default CPU generator, so the tracker's named states
(data-parallel, model-parallel, expert-parallel) must be CPU generator states: fork() then swaps them in and
out exactly as it swaps CUDA states on a GPU. Targeted: only the tracker's `add` and the module's two
private state accessors are replaced; torch.cuda's RNG functions stay as they are.
"""

import torch

from ._conditions import cuda_missing
from ._replace import replace, replaced_by

NAME = "cuda_rng_tracker"
needed = cuda_missing


def _get_cpu_rng_state(device=None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    # get_rng_state() already returns a copy, so `clone` needs no extra work; graph-safe states are a CUDA-graph
    # feature with no CPU counterpart.
    assert not graph_safe, "CUDA-graph-safe RNG states do not exist on CPU"
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, device=None, graph_safe: bool = False) -> None:
    assert not graph_safe, "CUDA-graph-safe RNG states do not exist on CPU"
    torch.set_rng_state(new_state)


def _add_cpu_state(self, name: str, seed: int) -> None:
    """CudaRNGStatesTracker.add on CPU: records the generator state `seed` gives, without touching the default
    generator (a fresh Generator yields the same state torch.manual_seed(seed) would)."""
    if seed in self.seeds_:
        raise Exception(f"seed {seed} already exists")
    if name in self.states_:
        raise Exception(f"cuda rng state {name} already exists")
    self._is_initialized = True
    self.seeds_.add(seed)
    self.states_[name] = torch.Generator().manual_seed(seed).get_state()


def is_applied() -> bool:
    from megatron.core.tensor_parallel import random as mcore_random

    return replaced_by(mcore_random.CudaRNGStatesTracker, "add", NAME)


def apply() -> None:
    from megatron.core.tensor_parallel import random as mcore_random

    replace(mcore_random, "_get_cuda_rng_state", _get_cpu_rng_state, NAME)
    replace(mcore_random, "_set_cuda_rng_state", _set_cpu_rng_state, NAME)
    replace(mcore_random.CudaRNGStatesTracker, "add", _add_cpu_state, NAME)
