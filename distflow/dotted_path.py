"""Loads a user-supplied callable from a 'module:function' path (pipelines, DAG nodes, reward scorers)."""
import importlib
from typing import Callable


def load_callable(path: str, what: str) -> Callable:
    """Imports `path` ('module:function', or 'module.function') and returns the callable.

    Raises ValueError naming `what` (e.g. "dag.pipeline", "node 'reward'") and what went wrong.
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{what}: {path!r} is not a dotted path; expected 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{what}: cannot import module {module_name!r} of {path!r}: {err}") from None
    target = getattr(module, attr, None)
    if not callable(target):
        raise ValueError(f"{what}: module {module_name!r} has no function {attr!r}")
    return target
