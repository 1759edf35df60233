"""`python -m distflow.plan CONFIG [section.key=value ...] --world-size N --gpu-memory-gb M`: print where every
rank goes, what each GPU will hold, and how data and weights move, without starting anything.

The model's architecture comes from --model-config (a HF config.json, or a model directory), else from
model.path/config.json. examples/model_configs/ ships the published configs of the example models, so a
plan for a 235B run needs neither the checkpoint nor a GPU.
Exit status: 0 the plan fits (printed; warnings about other things may be included); 1 it does not fit:
a phase needs more than the GPU, or the engine cannot start or hold one full-length sample (printed, each
shortfall with its causes largest first and the knobs that reduce them); 2 a config, layout or model
error (nothing would start).

Examples:
    python -m distflow.plan examples/configs/gpu_base.yaml actor.tp=2 rollout.engine_tp=2 \\
        model.path=/models/Qwen2.5-7B --world-size 8 --gpu-memory-gb 80
    python -m distflow.plan examples/configs/gpu_base.yaml --world-size 128 --gpu-memory-gb 80 \\
        --model-config examples/model_configs/qwen3-235b-a22b.json --bandwidth-gbps 400
"""

import argparse
import sys

from distflow.config import ConfigError, resolve
from distflow.config.__main__ import split_config_args
from distflow.dag.graph import PipelineError
from distflow.layout import LayoutError
from distflow.plan.model_size import ModelArch
from distflow.plan.report import ATTENTION_TODAY, build_plan, render

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_ERROR = 0, 1, 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distflow.plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("args", nargs="*", help="CONFIG.yaml [section.key=value ...]")
    parser.add_argument("--world-size", type=int, required=True, help="ranks (GPUs) of the whole job")
    parser.add_argument(
        "--gpu-memory-gb",
        type=float,
        default=80.0,
        help="memory of one GPU in GiB, as sold: 80 (H100/A100 80GB), 141 (H200), 96 (H20)",
    )
    parser.add_argument(
        "--bandwidth-gbps",
        type=float,
        default=400.0,
        help="per-GPU link bandwidth for the weight sync, Gbit/s (default 400: one NDR NIC per GPU)",
    )
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument(
        "--model-config", help="HF config.json (or model dir) to plan for; default model.path"
    )
    parser.add_argument(
        "--attention",
        choices=["unfused", "flash"],
        default=ATTENTION_TODAY,
        help="unfused: Megatron's local layer spec (what the Megatron worker builds today; keeps "
        "the softmax); flash: Transformer Engine's fused attention",
    )
    ns = parser.parse_intermixed_args(argv)
    path, overrides = split_config_args(ns.args)
    try:
        cfg = resolve(path, overrides)
        source = ns.model_config or cfg.model.path
        if not source:
            raise ConfigError("no model to plan for: set model.path or pass --model-config CONFIG.json")
        arch = ModelArch.from_json(source)
        plan = build_plan(
            cfg,
            ns.world_size,
            arch,
            ns.gpu_memory_gb,
            ns.bandwidth_gbps,
            ns.gpus_per_node,
            arch_source=str(source),
            attention=ns.attention,
        )
    except (ConfigError, LayoutError, PipelineError, FileNotFoundError, ValueError) as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_ERROR
    print(render(plan))
    return EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT


if __name__ == "__main__":
    sys.exit(main())
