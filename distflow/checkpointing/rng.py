"""Every random generator of this rank, captured and restored (python, numpy, torch CPU, CUDA, Megatron's
tensor-parallel tracker), so that a resumed run draws the same numbers as one that never stopped."""

import random

import numpy as np
import torch


def capture_rng_state() -> dict:
    """This rank's generator states (plain Python objects and CPU tensors, for torch.save)."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "megatron_tracker": _megatron_tracker_states(),
    }
    return state


def restore_rng_state(state: dict) -> None:
    """Inverse of capture_rng_state on the same rank of the same layout."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if state["megatron_tracker"] is not None:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().set_states(state["megatron_tracker"])


def _megatron_tracker_states():
    """The dropout streams of Megatron's model-parallel RNG tracker (None before it is seeded)."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    states = tracker.get_states()
    return {name: s.clone() for name, s in states.items()} if states else None
