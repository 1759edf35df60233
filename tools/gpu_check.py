"""GPU validation of DistFlow on one GPU: Megatron MFU, CUDA-IPC weight staging, colocated memory release.

    python tools/gpu_check.py --out DIR            # on a CUDA machine (tools/gpu_check.sh installs the wheels)
    python tools/gpu_check.py --out DIR --cpu-smoke  # the same code paths on a tiny model on CPU (fp32, gloo)

One process, a world of one rank (NCCL on GPU, gloo on CPU), DistFlow's own code in every check
(gpu_checks/*.py says what each measures):
  train_<size>   the actor's train_step and log-prob pass on a random-weight Llama-shaped model (1B, 3B);
                 tokens/s and MFU against the GPU's dense bf16 peak (gpu_checks/flops.py);
  staging        the WeightResharder's staging buffers opened by a second process (CUDA IPC), the bytes
                 verified against the Megatron shards, GB/s against a device copy, staging released/restored;
  memory         the reference model's offload (ref.offload) and what the actor keeps resident;
  drop_actor     CUDA memory once the first actor is gone.
Writes DIR/gpu_check.json (after every check) with every figure; docs/gpu_validation.md explains the fields.
"""

import argparse
import importlib.util
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from gpu_checks import sglang_stand_in
from gpu_checks.context import CheckContext, memory_reading
from gpu_checks.memory import check_memory
from gpu_checks.runner import run_checks, write_results
from gpu_checks.staging import check_staging
from gpu_checks.training import check_training

from distflow import distributed

REPO = Path(__file__).resolve().parents[1]
# (sizes, seq_len, rows, max_tokens, repeats, bucket_mb): the GPU run, and the CPU smoke run's tiny model
# (buckets of 0.1 MiB, so that its embedding travels in row ranges over several buckets, as a 7B's does).
# 4096 tokens per micro-batch: Megatron's local attention (no Transformer Engine) keeps every layer's
# [rows, heads, s, s] scores for backward, and the 3B's logits are 128K wide; 8192 would near 141 GB.
GPU_DEFAULTS = dict(sizes="1b,3b", seq_len=1024, rows=48, max_tokens=4096, repeats=3, bucket_mb=512)
CPU_DEFAULTS = dict(sizes="tiny", seq_len=64, rows=8, max_tokens=256, repeats=2, bucket_mb=0.1)
# Seconds each check needs at least (GPU; the CPU smoke run's tiny model needs a fraction).
ESTIMATES = {"train_first": 90, "staging": 90, "memory": 45, "drop_actor": 5, "train": 150}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json")
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny model on CPU: the code paths, no figures"
    )
    parser.add_argument(
        "--budget-s", type=float, default=480, help="all checks end within this (default 8 min)"
    )
    parser.add_argument("--sizes", help="comma-separated model sizes: 1b, 3b, tiny (default 1b,3b)")
    parser.add_argument("--seq-len", type=int, help="longest row in tokens (rows are 1/2 to 1 of it)")
    parser.add_argument("--rows", type=int, help="rows of the batch the actor trains on")
    parser.add_argument("--max-tokens", type=int, help="token budget of one packed micro-batch")
    parser.add_argument("--repeats", type=int, help="timed calls per figure (the median is kept)")
    parser.add_argument("--bucket-mb", type=float, help="weight-sync bucket size (sync.bucket_mb)")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, if not an H100/H200")
    parser.add_argument(
        "--timeout-s", type=float, default=300, help="bound on every wait for the 2nd process"
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    defaults = CPU_DEFAULTS if args.cpu_smoke else GPU_DEFAULTS
    sizes_arg = args.sizes or defaults["sizes"]
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device is visible; use --cpu-smoke for the CPU run")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file = out_dir / "gpu_check.json"

    results = {"environment": environment(device, sglang_stand_in.install())}
    distributed.init_process_group(device, timeout_s=int(args.timeout_s))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        ctx = CheckContext(
            device=device,
            work_dir=Path(work),
            deadline=start + args.budget_s,
            sizes=sizes_arg.split(","),
            seq_len=args.seq_len or defaults["seq_len"],
            rows=args.rows or defaults["rows"],
            max_tokens=args.max_tokens or defaults["max_tokens"],
            repeats=args.repeats or defaults["repeats"],
            bucket_mb=args.bucket_mb or defaults["bucket_mb"],
            peak_tflops=args.peak_tflops,
            timeout_s=args.timeout_s,
        )
        distributed.initialize_megatron_groups(ctx.layout, ctx.placement, timeout_s=int(args.timeout_s))
        distributed.seed_everything(1)
        results["settings"] = {
            k: v for k, v in vars(ctx).items() if k not in ("state", "work_dir", "deadline")
        }
        run_checks(checks(ctx, scale=0.2 if args.cpu_smoke else 1.0), ctx, results, out_file)
    results["total_s"] = time.monotonic() - start
    write_results(out_file, results)
    print(f"[gpu_check] wrote {out_file}", flush=True)
    distributed.destroy_process_group()
    failed = [name for name, r in results.items() if isinstance(r, dict) and "error" in r]
    return 1 if failed else 0


def checks(ctx, scale: float) -> list:
    first, *others = ctx.sizes
    est = {k: max(5, int(v * scale)) for k, v in ESTIMATES.items()}
    return [
        (f"train_{first}", est["train_first"], lambda c: check_training(c, first, keep_actor=True)),
        ("staging", est["staging"], check_staging),
        ("memory", est["memory"], lambda c: check_memory(c, first)),
        ("drop_actor", est["drop_actor"], drop_actor),
        *[(f"train_{size}", est["train"], lambda c, s=size: check_training(c, s)) for size in others],
    ]


def drop_actor(ctx) -> dict:
    """CUDA memory before and after the first actor (and its optimizer) is deleted."""
    before = memory_reading(ctx.torch_device)
    ctx.state.pop("actor", None)
    if ctx.device == "cuda":
        torch.cuda.empty_cache()
    return {"before": before, "after": memory_reading(ctx.torch_device)}


def environment(device: str, sglang: str) -> dict:
    env = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "sglang": sglang,
        "distflow_commit": _git_commit(),
    }
    try:
        from megatron.core import package_info

        env["megatron_core"] = package_info.__version__
    except ImportError as exc:
        env["megatron_core"] = f"missing: {exc}"
    env["transformer_engine"] = _importable("transformer_engine")
    env["wheels_dir"] = os.environ.get("GPU_CHECK_WHEELS", "")
    return env


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
