"""Builds a DistFlowConfig from a YAML file plus dotted command-line overrides, checking every key and type.

An unknown key or a value of the wrong type is a ConfigError that names the full dotted key, what was
given, what is valid, and the closest valid key (`actor.tpp` -> "did you mean actor.tp?").
"""

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from distflow.config.schema import DistFlowConfig
from distflow.config.verl_keys import VALUE_SYNONYMS, explain


class ConfigError(ValueError):
    """A config problem, with the offending key and what would be valid."""


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> DistFlowConfig:
    """Reads YAML `path` (optional), applies `key.sub=value` overrides, returns the typed config."""
    raw = _read_yaml(path) if path else {}
    for item in overrides:
        _apply_override(raw, item)
    return build(DistFlowConfig, raw)


def _read_yaml(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(raw).__name__}")
    return raw


def _apply_override(raw: dict, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like section.key=value (e.g. actor.tp=2)")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text  # not YAML (e.g. a path with a colon): keep the string
    node = raw
    parts = key.strip().split(".")
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {'.'.join(parts[: depth + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


def build(cls, raw: Any, prefix: str = ""):
    """Builds dataclass `cls` from a mapping, recursively; rejects unknown keys and wrong types."""
    where = prefix.rstrip(".") or "the config"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(unknown_key_message(prefix + str(key), list(fields), prefix, value))
    values = {}
    for name, value in raw.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = build(hint, value, f"{prefix}{name}.")
        else:
            values[name] = coerce(value, hint, prefix + name)
    return cls(**values)


def unknown_key_message(full_key: str, valid: list[str], prefix: str = "", value: Any = None) -> str:
    """Names the key, then its DistFlow name when it is a verl key (`value`: what was given under it, whose
    leaves may be the verl key, e.g. actor_rollout_ref -> {actor: {optim: {lr: ...}}}), else the closest
    valid key and the valid ones."""
    for leaf_key in _leaf_keys(full_key, value):
        verl = explain(leaf_key)
        if verl:
            return f"unknown config key {leaf_key!r}; {verl}"
    leaf = full_key[len(prefix) :]
    close = difflib.get_close_matches(leaf, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    section_name = prefix.rstrip(".") or "the top level"
    if len(valid) > 40:  # a library's field list (Megatron, SGLang): the nearest few say more than all 500
        near = difflib.get_close_matches(leaf, valid, n=5, cutoff=0.4)
        return (
            f"unknown config key {full_key!r}{hint} (nearest valid keys in {section_name}: {', '.join(near)})"
        )
    return f"unknown config key {full_key!r}{hint} (valid keys in {section_name}: {', '.join(sorted(valid))})"


def _leaf_keys(key: str, value: Any) -> list[str]:
    """`key` and the dotted keys of every leaf below it (a mapping given under an unknown key)."""
    if not isinstance(value, dict):
        return [key]
    return [key] + [leaf for k, v in value.items() for leaf in _leaf_keys(f"{key}.{k}", v)]


def coerce(value: Any, hint, key: str):
    """Checks `value` against a type annotation; ints are accepted where floats are expected."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], key)
    if origin is Literal:
        if value not in args:
            synonym = VALUE_SYNONYMS.get(str(value).lower())
            close = (
                [synonym]
                if synonym in args
                else difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            )
            hint_text = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}={value!r} is not one of {list(args)}{hint_text}")
        return value
    if origin is list or hint is list:
        if args and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [
                value
            ]  # data.train_files=foo.parquet: one path where a list is expected is a list of one
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r} ({type(value).__name__})")
        return [coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)] if args else value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r} ({type(value).__name__})")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-6" (no dot) as a string; every user writes learning rates that way
            return float(value)
        except ValueError:
            pass
    if hint in (int, float, str, bool):
        # bool is a subclass of int: `actor.tp=true` must not pass as 1.
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise ConfigError(f"{key} must be {hint.__name__}, got {value!r} ({type(value).__name__})")
        return value
    return value
