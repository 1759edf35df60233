"""`python -m distflow.config show [CONFIG] [key=value ...]`: print the resolved config as YAML.
`python -m distflow.config docs`: print every field with its type, default and documentation."""
import argparse
import dataclasses
import sys
import typing

import yaml

from distflow.config import ConfigError, resolve
from distflow.config.schema import DistFlowConfig


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distflow.config", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print the resolved config")
    show.add_argument("args", nargs="*", help="[CONFIG.yaml] [section.key=value ...]")
    sub.add_parser("docs", help="print every field with its documentation")
    ns = parser.parse_args(argv)
    if ns.command == "docs":
        print_docs(DistFlowConfig)
        return 0
    path, overrides = split_config_args(ns.args)
    try:
        cfg = resolve(path, overrides)
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
        type_name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
        print(f"  {prefix}{f.name} ({type_name}, default {default!r}): {f.metadata.get('help', '')}")


if __name__ == "__main__":
    sys.exit(main())
