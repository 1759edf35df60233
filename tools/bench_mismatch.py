"""Benchmarks rollout correction: the main job with its engines in bf16 against the fp32 trainer (a controlled
engine/trainer disagreement), with the correction off and on, in one run; an fp32 engine gives the baseline.

Example: python tools/bench_mismatch.py --steps 30
         python tools/bench_mismatch.py --correction is_level=sequence,mask_level=sequence

Each job is the README's main job shape (`distflow.train` on the copy task, 2 CPU processes, actor TP=2, one
SGLang engine per rank, the tiny qwen2 model) after --sft-warmup supervised steps. Jobs:
  fp32          engines in fp32, as the trainer: the mismatch is numerics only (about 1e-6 per token);
  bf16          engines in bf16 (rollout.dtype=bfloat16), no correction: the samples come from a nearby policy;
  bf16+corr     the same with algorithm.rollout_correction (--correction; default token TIS capped at 2 and
                a token mask outside [0.5, 2]).
Printed per job: the mismatch metrics (rollout_corr/*, means over the steps), the correction's weights and
masked share, the reward over the first and the last 5 steps. Last line: the ratios of bf16+corr over bf16. The same seeds and prompts in every job; the samples differ where the engines' policies do.
"""

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from distflow.testing.copy_task import copy_job_args, copy_task, metrics_rows
from distflow.testing.launch import REPO_ROOT as REPO
from distflow.testing.launch import torchrun

SHOWN = (
    "rollout_corr/logprob_abs_diff",
    "rollout_corr/logprob_abs_diff_max",
    "rollout_corr/kl",
    "rollout_corr/ppl_ratio",
    "rollout_corr/is_weight_mean",
    "rollout_corr/is_weight_max",
    "rollout_corr/masked_fraction",
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="RL steps per job")
    parser.add_argument("--sft-warmup", type=int, default=12, help="trainer.sft_warmup_steps")
    parser.add_argument(
        "--correction",
        default="is_level=token,is_cap=2,mask_level=token,mask_low=0.5,mask_high=2",
        help="algorithm.rollout_correction settings of the corrected job, comma-separated key=value",
    )
    parser.add_argument("--work-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--timeout-s", type=float, default=1800, help="per job")
    args = parser.parse_args(argv)
    if args.steps < 5:
        parser.error(f"--steps={args.steps}: at least 5 (the reward is the mean of the last 5)")
    correction = [f"algorithm.rollout_correction.{kv.strip()}" for kv in args.correction.split(",") if kv]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_mismatch_"))
    model, data = _task(work, args)
    jobs = {
        "fp32": ["rollout.dtype=float32"],
        "bf16": ["rollout.dtype=bfloat16"],
        "bf16+corr": ["rollout.dtype=bfloat16", *correction],
    }
    results = {}
    for name, overrides in jobs.items():
        out = work / name.replace("+", "_")
        shutil.rmtree(out, ignore_errors=True)  # a --work-dir used before: its checkpoints would be resumed
        print(f"[bench_mismatch] {name}: {args.steps} steps ({' '.join(overrides)}) ...", flush=True)
        _train(model, data, out, overrides, args)
        results[name] = _summarize(out)
        _print_job(name, results[name])
    off, on = results["bf16"], results["bf16+corr"]
    print(
        f"ratios of bf16+corr over bf16: reward {on['reward'] / max(off['reward'], 1e-9):.3f}x, "
        f"rollout_corr/kl {on['rollout_corr/kl'] / max(off['rollout_corr/kl'], 1e-12):.2f}x, "
        f"logprob_abs_diff {on['rollout_corr/logprob_abs_diff'] / off['rollout_corr/logprob_abs_diff']:.2f}x; "
        f"bf16 over fp32 logprob_abs_diff "
        f"{off['rollout_corr/logprob_abs_diff'] / max(results['fp32']['rollout_corr/logprob_abs_diff'], 1e-12):.0f}x"
    )


def _task(work: Path, args) -> tuple[Path, Path]:
    """The README main job's model (hidden 128) and copy data with a prompt for every step."""
    return copy_task(work, train=32 * (args.steps + args.sft_warmup + 2), hidden=128, ffn=512)


def _train(model: Path, data: Path, out: Path, overrides: list[str], args) -> None:
    torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=args.timeout_s,
        cwd=str(REPO),
        args=[
            *copy_job_args(model, data, out),
            f"trainer.sft_warmup_steps={args.sft_warmup}",
            f"trainer.total_steps={args.steps}",
            "checkpoint.save_every=0",
            "checkpoint.export_hf=false",
            "tracking.backends=[jsonl]",
            *overrides,
        ],
    )


def _summarize(out: Path) -> dict:
    rows = metrics_rows(out)
    summary = {name: statistics.mean(r[name] for r in rows) for name in SHOWN if all(name in r for r in rows)}
    summary["reward"] = statistics.mean(r["reward/mean"] for r in rows[-5:])
    summary["reward_first"] = statistics.mean(r["reward/mean"] for r in rows[:5])
    return summary


def _print_job(name: str, s: dict) -> None:
    shown = ", ".join(f"{k.removeprefix('rollout_corr/')} {s[k]:.3g}" for k in SHOWN if k in s)
    print(f"  {name}: reward {s['reward_first']:.3f} (first 5 steps) -> {s['reward']:.3f} (last 5); {shown}")


if __name__ == "__main__":
    main()
