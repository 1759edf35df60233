"""Keeps a frozen model's weights in CPU memory between its forward passes (`ref.offload`).

The reference model runs one forward per RL step; colocated with SGLang engines and the actor, its GPU
memory is better spent on the KV cache the rest of the time. Parameters and registered buffers move with
`Module.to`, which swaps each tensor's data in place, so the Parameter objects (and the tensor-parallel
attributes Megatron sets on them) stay the same. Plain tensor attributes (the rotary inverse frequencies,
the cached rotary table) are small and stay where they are. On CPU there is nothing to move.
"""

from contextlib import contextmanager

import torch


class ParameterOffloader:
    """Moves `modules` to CPU now (when `device` is a GPU) and back to `device` only inside `onloaded()`."""

    def __init__(self, modules: list, device: torch.device):
        self.modules, self.device = list(modules), device
        self.active = device.type != "cpu"
        """False on CPU: the weights already live in host memory."""
        self.offload()

    def offload(self) -> None:
        if not self.active:
            return
        for module in self.modules:
            module.to("cpu")
        torch.cuda.empty_cache()  # hand the freed blocks back to other users of the GPU (SGLang)

    @contextmanager
    def onloaded(self):
        """The weights on `device` for the duration of the block; back in CPU memory after it (also on error)."""
        if self.active:
            for module in self.modules:
                module.to(self.device)
        try:
            yield
        finally:
            self.offload()
