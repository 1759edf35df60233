"""Turns dag.pipeline (a built-in name or 'module:function') into a Pipeline for a config."""

from distflow.config import ConfigError
from distflow.config.dotted_path import load_callable
from distflow.config.schema import DistFlowConfig
from distflow.dag.builtin import BUILTIN, CHECKS
from distflow.dag.graph import Pipeline

SMOKE = "smoke"
"""dag.pipeline=smoke runs no DAG: distflow.train starts the end-to-end check of the pieces (distflow.smoke_run)."""
RUNNABLE = (SMOKE, *BUILTIN)
"""The built-in names a distflow.train job can run (user pipelines 'module:function' too)."""


def load_pipeline(cfg: DistFlowConfig) -> Pipeline:
    """The pipeline of dag.pipeline for `cfg`. A built-in one is checked first (ConfigError for settings it
    cannot run, e.g. reward.model_path with dapo), so an incompatible graph is never built."""
    name = cfg.dag.pipeline
    if name in BUILTIN:
        CHECKS[name](cfg)
        return BUILTIN[name](cfg)
    if ":" not in name:
        raise ConfigError(
            f"dag.pipeline={name!r} is neither a built-in pipeline {sorted(BUILTIN)} "
            "nor a 'module:function' path"
        )
    try:
        fn = load_callable(name, f"dag.pipeline={name!r}")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    pipeline = fn(cfg)
    if not isinstance(pipeline, Pipeline):
        raise ConfigError(
            f"dag.pipeline={name!r} returned {type(pipeline).__name__}, not a distflow.dag.Pipeline"
        )
    return pipeline
