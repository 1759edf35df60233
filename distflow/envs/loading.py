"""rollout.env and rollout.tool_parser: a built-in name or a user class by dotted path ('module:Class' or
'path/to/file.py:Class'), checked before any process group exists."""

import inspect

from distflow.config.dotted_path import load_callable
from distflow.envs import builtin
from distflow.envs.base import Environment
from distflow.envs.tool_parsers import PARSERS


class EnvError(ValueError):
    """A rollout.env / rollout.tool_parser that cannot be used, named with the reason."""


def load_environment(spec: str) -> type:
    """The environment class named by `spec` (rollout.env); EnvError when it cannot serve trajectories."""
    cls = builtin.BUILTIN.get(spec) or _load_class(spec, "rollout.env")
    missing = [name for name in ("reset", "step") if not callable(getattr(cls, name, None))]
    if issubclass(cls, Environment) and cls.step is Environment.step:
        missing.append("step (Environment.step is abstract)")
    if missing:
        raise EnvError(f"rollout.env={spec}: the class {cls.__name__} lacks {', '.join(missing)}")
    try:
        inspect.signature(cls).bind()
    except TypeError:
        raise EnvError(
            f"rollout.env={spec}: {cls.__name__}() must take no arguments (a new one serves each trajectory; "
            "its state comes from reset(sample))"
        ) from None
    return cls


def load_tool_parser(spec: str):
    """An instance of the parser named by `spec` (rollout.tool_parser)."""
    cls = PARSERS.get(spec) or _load_class(spec, "rollout.tool_parser")
    if not callable(getattr(cls, "parse", None)) or not isinstance(getattr(cls, "MARKERS", None), tuple):
        raise EnvError(
            f"rollout.tool_parser={spec}: {cls.__name__} needs parse(text) -> tuple[ToolCall, ...] and a "
            "MARKERS tuple; built-in parsers: " + ", ".join(PARSERS)
        )
    return cls()


def _load_class(spec: str, key: str) -> type:
    choices = sorted(builtin.BUILTIN) if key == "rollout.env" else sorted(PARSERS)
    if ":" not in spec and "." not in spec:
        raise EnvError(f"{key}={spec!r} is not a built-in ({', '.join(choices)}) nor a 'module:Class' path")
    try:
        cls = load_callable(spec, key)
    except ValueError as err:
        raise EnvError(str(err)) from None
    if not inspect.isclass(cls):
        raise EnvError(f"{key}={spec}: {cls!r} is not a class")
    return cls
