"""`python -m distflow.dag show CONFIG [overrides] [--world-size N]`: print the workflow graph, with each
node's role, ranks and parallel layout, without starting anything."""

import argparse
import sys

from distflow.config import ConfigError, resolve
from distflow.config.__main__ import split_config_args
from distflow.dag.graph import PipelineError
from distflow.dag.loading import load_pipeline
from distflow.dag.roles import describe_pipeline
from distflow.layout import ClusterLayout, LayoutError
from distflow.layout.model_shape import ModelShape


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distflow.dag", description=__doc__)
    parser.add_argument("command", choices=["show"], help="show: print the graph")
    parser.add_argument("args", nargs="*", help="CONFIG.yaml [section.key=value ...]")
    parser.add_argument("--world-size", type=int, default=1, help="ranks of the job (default 1)")
    ns = parser.parse_intermixed_args(argv)
    path, overrides = split_config_args(ns.args)
    try:
        cfg = resolve(path, overrides)
        shape = ModelShape.from_hf_dir(cfg.model.path) if cfg.model.path else None
        cluster = ClusterLayout.from_config(cfg, ns.world_size, shape)
        print(describe_pipeline(load_pipeline(cfg), cluster))
    except (ConfigError, LayoutError, PipelineError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
