"""Turns dag.pipeline (a built-in name or 'module:function') into a Pipeline for a config."""
from distflow.config import ConfigError
from distflow.config.dotted_path import load_callable
from distflow.config.schema import DistFlowConfig
from distflow.dag.builtin import BUILTIN
from distflow.dag.graph import Pipeline


def load_pipeline(cfg: DistFlowConfig) -> Pipeline:
    name = cfg.dag.pipeline
    if name in BUILTIN:
        return BUILTIN[name](cfg)
    if ":" not in name:
        raise ConfigError(f"dag.pipeline={name!r} is neither a built-in pipeline {sorted(BUILTIN)} "
                          "nor a 'module:function' path")
    try:
        fn = load_callable(name, f"dag.pipeline={name!r}")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    pipeline = fn(cfg)
    if not isinstance(pipeline, Pipeline):
        raise ConfigError(f"dag.pipeline={name!r} returned {type(pipeline).__name__}, not a distflow.dag.Pipeline")
    return pipeline
