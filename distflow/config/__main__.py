"""`python -m distflow.config show [CONFIG] [key=value ...]`: check the config and the files it names (the
    pre-flight checks distflow.train runs: data, tokenizer, scorers, checkpoints) and print it as YAML;
    --config-only skips the files.
`python -m distflow.config docs`: print every field with its type (choices too), default and documentation.
`python -m distflow.config verl-keys [--markdown]`: print the verl -> DistFlow key map."""

import argparse
import dataclasses
import sys
import typing
from typing import Literal

import yaml

from distflow.config import ConfigError, resolve
from distflow.config.schema import DistFlowConfig
from distflow.config.verl_keys import render_markdown, render_table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distflow.config",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print the resolved config")
    show.add_argument("args", nargs="*", help="[CONFIG.yaml] [section.key=value ...]")
    show.add_argument(
        "--config-only",
        action="store_true",
        help="check the config alone, not the data, model and scorer files it names",
    )
    sub.add_parser("docs", help="print every field with its documentation")
    verl = sub.add_parser("verl-keys", help="print the verl -> DistFlow config key map")
    verl.add_argument("--markdown", action="store_true", help="as docs/verl_key_map.md")
    ns = parser.parse_args(argv)
    if ns.command == "docs":
        print_docs(DistFlowConfig)
        return 0
    if ns.command == "verl-keys":
        print(render_markdown() if ns.markdown else render_table(), end="" if ns.markdown else "\n")
        return 0
    path, overrides = split_config_args(ns.args)
    try:
        cfg = resolve(path, overrides)
        if not ns.config_only:
            # Imported here: the pre-flight sits above the config layer (it reads data, scorers, pipelines).
            from distflow.preflight import preflight  # noqa: PLC0415 - see above

            print(f"# {preflight(cfg).describe()}", file=sys.stderr)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False), end="")
    return 0


def split_config_args(args):
    """The first argument without '=' is the config file; the rest are overrides."""
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return None, list(args)


def print_docs(cls, prefix: str = "") -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            print(f"\n[{prefix}{f.name}] {f.metadata.get('help', '')}")
            print_docs(hint, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        print(f"  {prefix}{f.name} ({type_name(hint)}, default {default!r}): {f.metadata.get('help', '')}")


def type_name(hint) -> str:
    """A field's type as the docs print it; a choice field lists its choices ("one of: auto, cpu, cuda")."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of: " + ", ".join(map(str, args))
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{type_name(inner[0])}, or null"
    return getattr(hint, "__name__", None) if origin is None else str(hint).replace("typing.", "")


if __name__ == "__main__":
    sys.exit(main())
