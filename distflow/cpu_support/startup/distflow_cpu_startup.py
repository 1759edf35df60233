"""Interpreter-start hook for DistFlow's CPU environment (loaded by a .pth file that ci/setup.sh writes).

Why: the only torchvision on PyPI is a CUDA build. Beside the CPU torch its `_C` library does not load, so
the op schemas `torchvision::nms` / `torchvision::qnms` never get defined and `import torchvision` fails
("operator torchvision::nms does not exist"). transformers imports torchvision whenever it is installed,
and SGLang's engine needs it, so every process of the CPU environment (training ranks, SGLang schedulers,
tools, tests) must see the schemas before torchvision runs.

The hook costs nothing at start-up: it only registers an import finder. When torchvision is first
imported it defines the missing schemas, and only on a torch without CUDA. This module must not import
distflow (it runs before site-packages are fully set up).
"""

import importlib.abc
import sys

_TORCHVISION_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARIES = []  # torch.library.Library objects must stay alive for their definitions to stay.


def define_torchvision_op_schemas() -> None:
    """Defines the torchvision op schemas that a CUDA torchvision build cannot register on a CPU torch."""
    import torch  # noqa: PLC0415 - runs in every interpreter at start-up: torch only when the hook fires

    if torch.version.cuda is not None:
        return  # a CUDA torch loads torchvision's own library, which defines them
    missing = [name for name in _TORCHVISION_SCHEMAS if not _op_exists(torch, name)]
    if not missing:
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name in missing:
        lib.define(_TORCHVISION_SCHEMAS[name])
    _LIBRARIES.append(lib)


def _op_exists(torch, name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
        return True
    except RuntimeError:
        return False


class _TorchvisionSchemaFinder(importlib.abc.MetaPathFinder):
    """Runs define_torchvision_op_schemas once, just before the first `import torchvision`."""

    done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" and not self.done:
            type(self).done = True
            define_torchvision_op_schemas()
        return None  # let the normal finders import it


def install() -> None:
    if not any(isinstance(f, _TorchvisionSchemaFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionSchemaFinder())


install()
