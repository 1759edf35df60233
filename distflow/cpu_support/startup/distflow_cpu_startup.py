"""Interpreter-start hook for DistFlow's CPU environment (loaded by a .pth file that ci/setup.sh writes).

It makes two fixes, each when a module is first imported, in every process of the environment (training
ranks, SGLang's spawned schedulers, tools, tests):

1. torchvision's op schemas. The only torchvision on PyPI is a CUDA build. Beside the CPU torch its `_C` library does not load, so
the op schemas `torchvision::nms` / `torchvision::qnms` never get defined and `import torchvision` fails
("operator torchvision::nms does not exist"). transformers imports torchvision whenever it is installed,
and SGLang's engine needs it, so every process must see the schemas before torchvision runs.
2. SGLang's host buffers without CUDA. SGLang allocates the buffer of the experts it routed each token to
   (`return_routed_experts`, for MoE routing replay) as pinned memory registered with cudaHostRegister,
   which fails without CUDA; on a torch without CUDA that allocation becomes a plain CPU tensor.

The hook costs nothing at start-up: it only registers an import finder. Each fix runs when its module is
first imported, and only on a torch without CUDA. This module must not import
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


def allocate_host_buffers_without_cuda(common) -> None:
    """`common`: sglang.srt.mem_cache.pool_host.common, just executed. Its ALLOC_MEMORY_FUNCS maps a device
    type to the allocator of host buffers; "cpu" falls to the cudaHostRegister one."""
    import torch  # noqa: PLC0415 - runs in every interpreter at start-up: torch only when the hook fires

    if torch.version.cuda is not None:
        return

    def allocate(dims, dtype, device, pin_memory, allocator, **_):
        return allocator.allocate(dims, dtype=dtype, device=device)  # pinning needs CUDA

    common.ALLOC_MEMORY_FUNCS["cpu"] = allocate


_AFTER_IMPORT = {"sglang.srt.mem_cache.pool_host.common": allocate_host_buffers_without_cuda}


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Runs _AFTER_IMPORT[name](module) right after module `name` executes (it is found by the normal
    finders; only its loader's exec_module is wrapped)."""

    def find_spec(self, fullname, path=None, target=None):
        fix = _AFTER_IMPORT.get(fullname)
        if fix is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def execute_and_fix(module):
            execute(module)
            fix(module)

        spec.loader.exec_module = execute_and_fix  # this module's own loader instance
        return spec


def install() -> None:
    if not any(isinstance(f, _TorchvisionSchemaFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionSchemaFinder())
    if not any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())


install()
