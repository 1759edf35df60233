"""The two SGLang pieces the weight sync's staging path touches, for a machine without SGLang (the GPU check's).

DistFlow's staging (distflow.coordination.weights.staging, resharder) serializes buffer views with SGLang's
`MultiprocessingSerializer` and hands the engine `LocalSerializedTensor`s. SGLang's CUDA kernels cannot travel
to the GPU machine, so when `import sglang` fails, `install()` registers modules with these two names: the
serializer is SGLang's format (ForkingPickler bytes: CUDA tensors as IPC handles), read back with plain pickle
instead of SGLang's allow-listing SafeUnpickler. Where SGLang is installed nothing is replaced.
"""

import importlib.util
import io
import os
import pickle
import sys
import types
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

FORCE_ENV = "GPU_CHECK_SGLANG_STAND_IN"
"""=1: use the stand-in even where SGLang is installed (the CPU test of the GPU machine's path)."""
SERIALIZER_MODULE = "sglang.srt.utils"
TENSOR_MODULE = "sglang.srt.model_executor.model_runner_components.weight_updater"


class MultiprocessingSerializer:
    @staticmethod
    def serialize(obj, output_str: bool = False):
        assert not output_str, "the stand-in writes bytes only (DistFlow never asks for base64)"
        buf = io.BytesIO()
        ForkingPickler(buf).dump(obj)
        return buf.getvalue()

    @staticmethod
    def deserialize(data):
        return pickle.loads(data)


@dataclass
class LocalSerializedTensor:
    """Entry r: a serialized tensor for engine TP rank r (SGLang's class of the same name)."""

    values: list

    def get(self, rank: int):
        return MultiprocessingSerializer.deserialize(self.values[rank])


def install() -> str:
    """'sglang' if SGLang is importable (nothing changes), else 'stand-in' after registering the modules."""
    if os.environ.get(FORCE_ENV) != "1" and importlib.util.find_spec("sglang") is not None:
        return "sglang"
    names = ["sglang", "sglang.srt", SERIALIZER_MODULE, *_parents(TENSOR_MODULE)]
    for name in dict.fromkeys(names):
        module = sys.modules.setdefault(name, types.ModuleType(name))
        module.__path__ = []  # a package, so that submodules resolve through sys.modules
    sys.modules[SERIALIZER_MODULE].MultiprocessingSerializer = MultiprocessingSerializer
    sys.modules[TENSOR_MODULE].LocalSerializedTensor = LocalSerializedTensor
    LocalSerializedTensor.__module__ = TENSOR_MODULE  # pickled by this name, found again in the child
    return "stand-in"


def _parents(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]
