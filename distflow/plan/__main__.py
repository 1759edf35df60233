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

--simulate predicts one step's time at each of --gpus (weak scaling from --world-size), multi- and
single-controller, on a hardware profile (--profile h100|h200|a100|FILE.json); --calibrate FILE.json
measures this machine's profile first (docs/scaling.md).
    DRY_RUN=1 bash examples/grpo_qwen2.5_7b_1node.sh --simulate --gpus 8,16,32,64,128 --plot 7b.png
"""

import argparse
import sys
from pathlib import Path

from distflow.config import ConfigError, resolve
from distflow.config.__main__ import split_config_args
from distflow.dag.graph import PipelineError
from distflow.layout import LayoutError
from distflow.plan.model_size import ModelArch
from distflow.plan.report import ATTENTION_TODAY, build_plan, render
from distflow.plan.simulate import calibrate as calibration
from distflow.plan.simulate.hardware_profile import load_profile, parse_knobs
from distflow.plan.simulate.render import plot, render_sources, render_table
from distflow.plan.simulate.step import CONTROLLERS
from distflow.plan.simulate.sweep import DEFAULT_GPUS, sweep

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_ERROR = 0, 1, 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distflow.plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("args", nargs="*", help="CONFIG.yaml [section.key=value ...]")
    parser.add_argument(
        "--world-size", type=int, help="ranks (GPUs) of the whole job (required but with --calibrate alone)"
    )
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
    sim = parser.add_argument_group("simulation (docs/scaling.md)")
    sim.add_argument("--simulate", action="store_true", help="predict one step's time at each of --gpus")
    sim.add_argument(
        "--gpus",
        default=",".join(map(str, DEFAULT_GPUS)),
        help="GPU counts to simulate, comma-separated (default %(default)s)",
    )
    sim.add_argument("--controller", choices=[*CONTROLLERS, "both"], default="both")
    sim.add_argument("--profile", default="h100", help="h100 | h200 | a100 | a JSON profile (--calibrate)")
    sim.add_argument(
        "--knob", action="append", default=[], metavar="NAME=VALUE", help="an assumed efficiency (repeatable)"
    )
    sim.add_argument("--plot", help="write the throughput and breakdown plot to this PNG")
    sim.add_argument("--calibrate", metavar="OUT.json", help="measure this machine's profile into OUT.json")
    ns = parser.parse_intermixed_args(argv)
    path, overrides = split_config_args(ns.args)
    if ns.world_size is None and not (ns.calibrate and not ns.simulate):
        parser.error("--world-size is required")
    if ns.calibrate:
        cfg = resolve(path, overrides) if path else None
        model_dir = cfg.model.path if cfg is not None and cfg.model.path else None
        written = calibration.calibrate(Path(ns.calibrate), model_dir=model_dir, cfg=cfg, config_args=ns.args)
        print(f"wrote {written}")
        if not ns.simulate:
            return EXIT_FITS
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
        if ns.simulate:
            profile = load_profile(ns.profile, parse_knobs(ns.knob))
            controllers = CONTROLLERS if ns.controller == "both" else (ns.controller,)
            gpus = tuple(int(g) for g in ns.gpus.split(","))
            rows = sweep(
                lambda extra: resolve(path, overrides + extra),
                cfg,
                ns.world_size,
                arch,
                gpus,
                profile,
                controllers,
            )
    except (ConfigError, LayoutError, PipelineError, FileNotFoundError, ValueError) as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_ERROR
    print(render(plan))
    if ns.simulate:
        title = f"{arch.describe()} from {source}; {path} at {ns.world_size} GPUs"
        print()
        print(render_table(rows, profile, title))
        print(render_sources(profile))
        if ns.plot:
            short = (
                f"{arch.architecture or 'model'} {arch.total_params / 1e9:.1f} B, {ns.world_size}-GPU config"
            )
            plot(rows, ns.plot, f"{short}, profile {Path(ns.profile).stem}")
            print(f"plot: {ns.plot}")
    return EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT


if __name__ == "__main__":
    sys.exit(main())
