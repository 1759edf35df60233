"""DistFlow's entry point: every rank of the job runs this same program (multi-controller SPMD).

    torchrun --nproc-per-node N -m distflow.train CONFIG.yaml [section.key=value ...]

Each rank reads the config, validates it and the parallel layouts against the world size and the model,
runs the pre-flight checks of the files it names (distflow.preflight: data, tokenizer, scorers, checkpoints),
all before any process group exists, then joins the process groups (gloo on CPU, NCCL on GPU), builds
Megatron's groups from the layout, and runs the pipeline named by dag.pipeline. There is no driver:
rank 0 is special only for console output.

Rank environment (set by torchrun or a SLURM wrapper): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT. Outside torchrun it runs as a single rank.

Examples:
    torchrun --nproc-per-node 2 -m distflow.train examples/configs/smoke_cpu.yaml
    torchrun --nproc-per-node 8 -m distflow.train my.yaml actor.tp=4 rollout.engine_tp=2 trainer.total_steps=200
    python -m distflow.config show my.yaml actor.tp=4      # print the resolved config, start nothing
    python -m distflow.config docs                         # every config field, documented
"""

import argparse
import atexit
import os
import sys
import time

from distflow.config import ConfigError, resolve
from distflow.layout import ClusterLayout, LayoutError
from distflow.layout.model_shape import ModelShape
from distflow.run_context import RunContext, progress

# What a bad input raises before any process group exists: answered with one line and exit code 2.
EARLY_ERRORS = (ConfigError, LayoutError, FileNotFoundError, ValueError)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m distflow.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="YAML config file (see examples/configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.tp=2 rollout.n=8")
    return parser.parse_args(argv)


def prepare(argv=None) -> RunContext:
    """Config, layout and pre-flight checks, then process groups. Raises one of EARLY_ERRORS before any group."""
    args = parse_args(argv)
    cfg = resolve(args.config, args.overrides)
    # Imported once the config is valid, so a typo in it is answered in a fraction of a second: these
    # import torch (seconds on a loaded node).
    from distflow import distributed  # noqa: PLC0415
    from distflow.distributed import process_reaper  # noqa: PLC0415
    from distflow.distributed.library_noise import silence_library_noise  # noqa: PLC0415
    from distflow.preflight import check_model_paths, preflight  # noqa: PLC0415

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    check_model_paths(cfg)  # before the layout reads model.path's config.json
    shape = ModelShape.from_hf_dir(cfg.model.path)
    cluster = ClusterLayout.from_config(cfg, world_size, shape)
    report = preflight(cfg, cluster)
    progress(report.describe())

    # Before this attempt starts anything: what a failed one left on this host goes (process_reaper).
    rank = int(os.environ.get("RANK", 0))
    killed = process_reaper.start(cfg.trainer.output_dir, distributed.restarts(), rank)
    if killed:
        print(
            f"[distflow] rank {rank}: stopped what a failed attempt left running here: {', '.join(killed)}",
            flush=True,
        )
    device = distributed.resolve_device(cfg.trainer.device)
    silence_library_noise(cuda=device != "cpu")  # before Megatron-Core is imported
    env = distributed.init_process_group(device, cfg.trainer.dist_timeout_s)
    trains = distributed.initialize_megatron_groups(
        cluster.actor, cluster.placement, cfg.trainer.dist_timeout_s
    )
    distributed.seed_everything(cfg.trainer.seed, trains)
    return RunContext(
        cfg=cfg,
        cluster=cluster,
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        device=device,
        trains=trains,
    )


def main(argv=None) -> int:
    start = time.perf_counter()
    try:
        ctx = prepare(argv)
    except EARLY_ERRORS as err:
        report_early_error(err)
        return 2
    ctx.log(f"{ctx.world_size} rank(s) on {ctx.device}\n{ctx.cluster.describe()}")
    program(ctx.cfg.dag.pipeline)(ctx)
    ctx.log(f"done in {time.perf_counter() - start:.1f} s")
    from distflow.distributed import destroy_process_group  # noqa: PLC0415 - imported by prepare() already

    destroy_process_group()
    return 0


def program(pipeline: str):
    """The `run(ctx)` a job executes: the smoke check of the pieces for dag.pipeline=smoke, else the RL
    trainer over the pipeline's DAG (a built-in name or 'module:function', see distflow.dag.loading).
    Imported here, after prepare(): both import Megatron-Core, which must come after silence_library_noise."""
    if pipeline == "smoke":
        from distflow.smoke_run import run  # noqa: PLC0415 - after prepare(): the program imports Megatron-Core, which must follow silence_library_noise
    else:
        from distflow.trainer import run  # noqa: PLC0415 - after prepare(): the program imports Megatron-Core, which must follow silence_library_noise
    return run


# How long a rank other than 0 waits before it exits with an early error: rank 0 found the same error in the
# same config and files, and torchrun stops every rank when the first one exits, so rank 0 must go first.
OTHER_RANKS_GRACE_S = 10.0


def report_early_error(err: Exception) -> None:
    """One line on rank 0 (no process group exists yet: the rank comes from torchrun's RANK). The other
    ranks wait OTHER_RANKS_GRACE_S, in which torchrun stops them quietly once rank 0 has exited; a rank
    still running after it had an error rank 0 did not (a file missing on its node only) and says so."""
    message = " ".join(str(err).split())  # one line even when a library's message spans several
    label = "" if isinstance(err, (ConfigError, LayoutError)) else f"{type(err).__name__}: "
    rank = int(os.environ.get("RANK", 0))
    if rank != 0:
        time.sleep(OTHER_RANKS_GRACE_S)
    where = f"[rank {rank}] " if rank else ""
    print(f"distflow.train: error: {where}{label}{message}", file=sys.stderr, flush=True)


def exit_now(code: int) -> None:
    """Exits after the atexit handlers (W&B, logging, multiprocessing's children) but without the
    interpreter's teardown: its last garbage collection over the millions of objects torch, Megatron, SGLang
    and transformers hold, and the destructors of gloo's devices, took 3-4 s per rank (measured on the copy
    task job), and Triton's bindings then print hundreds of lines of 'leaked' warnings. Nothing else needs
    it: main() has closed the metrics, checkpoints, engines and process groups."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
