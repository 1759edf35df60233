"""A stand-in for the `torch` module inside chosen Megatron modules: torch, with a few attributes overridden.

Rebinding the module-global name `torch` in one Megatron module changes what that module's code sees and
nothing else: other modules and torch itself keep the real torch. Name lookups are also live inside
custom autograd backward passes, where a TorchFunctionMode is switched off. Views compose: a view's base
may itself be a view, when two patches touch the same module.
"""

import importlib
from typing import Any

from ._replace import replace


class TorchView:
    """Forwards every attribute to `base` except those in `overrides`."""

    def __init__(self, base: Any, overrides: dict[str, Any], purpose: str):
        self._base = base
        self._overrides = overrides
        self._purpose = purpose

    def __getattr__(self, name):
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._base, name)

    def __repr__(self):
        return f"<torch as seen by a patched Megatron module: {self._purpose}>"


def install_torch_view(module_names, overrides: dict[str, Any], purpose: str, patch_name: str) -> None:
    """Rebinds `torch` in each named module to a view over whatever `torch` it saw until now."""
    for module_name in module_names:
        module = importlib.import_module(module_name)
        replace(module, "torch", TorchView(module.torch, overrides, purpose), patch_name)
