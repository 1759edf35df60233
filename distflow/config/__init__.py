"""DistFlow's typed config: YAML + dotted overrides -> DistFlowConfig, validated before any process starts."""

from distflow.config.loader import ConfigError, load_config
from distflow.config.schema import DistFlowConfig
from distflow.config.validate import validate


def resolve(path=None, overrides=(), check_passthrough: bool = True) -> DistFlowConfig:
    """load_config + validate: the config every entry point should use."""
    return validate(load_config(path, overrides), check_passthrough=check_passthrough)


__all__ = ["ConfigError", "DistFlowConfig", "load_config", "resolve", "validate"]
