"""Loads a user-supplied callable from a 'module:function' path or a 'path/to/file.py:function' file path
(pipelines, DAG nodes, reward scorers), the second form as verl's custom_reward_function.path takes it."""

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable


def load_callable(path: str, what: str) -> Callable:
    """Imports `path` ('module:function', 'module.function' or 'path/to/file.py:function') and returns the
    callable. A relative file path is relative to the working directory (scorer worker processes inherit it,
    so the same string loads there too).

    Raises ValueError naming `what` (e.g. "dag.pipeline", "node 'reward'") and what went wrong.
    """
    module_name, sep, attr = path.rpartition(":") if is_file_path(path) else path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(
            f"{what}: {path!r} is not a dotted path; expected 'module:function' or 'path/to/file.py:function'"
        )
    if is_file_path(path):
        module = _import_file(module_name, path, what)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"{what}: cannot import module {module_name!r} of {path!r}: {err}") from None
    target = getattr(module, attr, None)
    if not callable(target):
        raise ValueError(f"{what}: module {module_name!r} has no function {attr!r}")
    return target


def is_file_path(path: str) -> bool:
    """True for 'some/file.py:function' (a file), False for 'package.module:function'."""
    return path.rpartition(":")[0].endswith(".py")


def _import_file(file_name: str, path: str, what: str):
    file = Path(file_name).expanduser().resolve()
    if not file.is_file():
        raise ValueError(
            f"{what}: no such file {file_name!r} (a relative path is relative to the working "
            f"directory, {Path.cwd()})"
        )
    # One module per file, under a name no package can have, so loading it twice runs it once.
    name = f"distflow_user_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # a user's file: any error at import is theirs to see, named
        del sys.modules[name]
        raise ValueError(f"{what}: importing {file} failed: {type(err).__name__}: {err}") from None
    return module
