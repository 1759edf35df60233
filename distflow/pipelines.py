"""Which program a `distflow.train` job runs: built-in pipelines by name, user pipelines by 'module:function'.

A pipeline is a function `run(ctx: RunContext) -> None` executed by every rank (multi-controller: no rank
is special unless the pipeline makes it so).
"""
import importlib

from distflow.config import ConfigError

# Built-in pipelines. The RL pipelines (grpo, ppo, dapo, rloo, reinforce_pp) join as the trainer lands.
BUILTIN = {
    "smoke": "distflow.smoke_run:run",
}
PLANNED = ("grpo", "ppo", "dapo", "rloo", "reinforce_pp")


def resolve_pipeline(name: str):
    """Returns the pipeline function for a built-in name or a 'module:function' path."""
    if name in BUILTIN:
        target = BUILTIN[name]
    elif ":" in name:
        target = name
    elif name in PLANNED:
        raise ConfigError(f"dag.pipeline={name!r} is not available in this version yet; "
                          f"built-in pipelines: {sorted(BUILTIN)}, or a user pipeline as 'module:function'")
    else:
        raise ConfigError(f"dag.pipeline={name!r} is neither a built-in pipeline {sorted(BUILTIN)} "
                          "nor a 'module:function' path")
    module_name, _, fn_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"dag.pipeline={name!r}: cannot import module {module_name!r}: {err}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"dag.pipeline={name!r}: module {module_name!r} has no function {fn_name!r}")
    return fn
