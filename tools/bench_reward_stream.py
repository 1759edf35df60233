"""Benchmarks streamed scoring (reward.stream): the same tiny GRPO job with a slow scorer, scored as each
prompt group finishes versus after the whole batch, in one run.

Example: python tools/bench_reward_stream.py --steps 6 --delay-ms 20

Each job is the README's main job shape (`distflow.train` on the copy task, 2 CPU processes, actor TP=2, one
SGLang engine per rank), with the copy scorer made slow by --delay-ms of sleep per sample: a stand-in for
what makes real rewards slow (a sandbox running code, a remote verifier or judge), which waits rather than
computes, so the scorer workers (reward.num_workers per rank) overlap the engine even on 2 cores. With
reward.stream=false the reward node scores the batch after generation; with true, each group goes to the
workers as its last response finishes, and the reward node only waits for what is left. Printed per job:
seconds per step and of the generate and reward nodes (the first --skip steps left out), the share of
samples scored before generation ended (perf/scored_during_generation), and one step's timeline of rank
0 (<output_dir>/timeline/rank0.jsonl: generate, reward_stream = first submission to last reward, reward).
Last line: the ratios of stream over no stream. The rewards of the two jobs are equal step by step (same
seeds, same samples): checked and printed.
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from distflow.rewards import copy_task as copy_reward
from distflow.testing.copy_task import copy_job_args, copy_task
from distflow.testing.launch import REPO_ROOT as REPO
from distflow.testing.launch import torchrun

DELAY_ENV = "DISTFLOW_BENCH_SCORE_DELAY_S"


def slow_copy(solution_str, ground_truth, extra_info=None, *, ended_with_eos: bool) -> float:
    """The copy-task reward after a sleep of $DISTFLOW_BENCH_SCORE_DELAY_S (runs in the scorer workers)."""
    time.sleep(float(os.environ.get(DELAY_ENV, "0")))
    return copy_reward.score(solution_str, ground_truth, extra_info, ended_with_eos=ended_with_eos)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="RL steps per job")
    parser.add_argument("--skip", type=int, default=1, help="first steps left out of the rates")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="scorer sleep per sample")
    parser.add_argument(
        "--workers", type=int, default=2, help="reward.num_workers (scorer processes per rank)"
    )
    parser.add_argument("--batch", type=int, default=32, help="prompts per step (data.train_batch_size)")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--work-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--timeout-s", type=float, default=900, help="per job")
    args = parser.parse_args(argv)
    if args.steps <= args.skip:
        parser.error(f"--steps={args.steps} must exceed --skip={args.skip}")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_reward_stream_"))
    model, data = _task(work, args)
    results = {}
    for stream in (False, True):
        out = work / f"stream_{str(stream).lower()}"
        shutil.rmtree(out, ignore_errors=True)  # a --work-dir used before: its checkpoints would be resumed
        print(
            f"[bench_reward_stream] reward.stream={str(stream).lower()}: {args.steps} steps ...", flush=True
        )
        _train(model, data, out, stream, args)
        results[stream] = _summarize(out, args.skip)
        _print_job(stream, results[stream])
        _print_timeline(out, args.steps)
    same = results[True]["rewards"] == results[False]["rewards"]
    print(f"  rewards step by step equal in both jobs: {same}")
    off, on = results[False], results[True]
    print(
        f"ratios of reward.stream=true over false ({len(on['rewards']) - args.skip} steady steps each): "
        f"{off['step_s'] / on['step_s']:.2f}x steps/s, reward node {on['reward_s'] / off['reward_s']:.2f}x "
        f"the time, generate+reward {(off['generate_s'] + off['reward_s']) / (on['generate_s'] + on['reward_s']):.2f}x faster"
    )


def _task(work: Path, args) -> tuple[Path, Path]:
    """The README main job's model (hidden 128) and copy data with a prompt for every step."""
    return copy_task(work, train=args.batch * (args.steps + 2), hidden=128, ffn=512)


def _train(model: Path, data: Path, out: Path, stream: bool, args) -> None:
    torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=args.timeout_s,
        env={**os.environ, DELAY_ENV: str(args.delay_ms / 1000)},
        cwd=str(REPO),
        args=[
            *copy_job_args(model, data, out),
            "trainer.sft_warmup_steps=2",
            f"reward.custom={Path(__file__).resolve()}:slow_copy",
            f"reward.num_workers={args.workers}",
            f"reward.stream={str(stream).lower()}",
            f"data.train_batch_size={args.batch}",
            f"rollout.n={args.n}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            f"trainer.total_steps={args.steps}",
            "checkpoint.save_every=0",
            "checkpoint.export_hf=false",
            "tracking.backends=[jsonl]",
        ],
    )


def _summarize(out: Path, skip: int) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in rows if r["step"] > skip]
    return {
        "rewards": [r["reward/mean"] for r in rows],
        "step_s": statistics.mean(r["timing_s/step"] for r in steady),
        "generate_s": statistics.mean(r["timing_s/generate"] for r in steady),
        "reward_s": statistics.mean(r["timing_s/reward"] for r in steady),
        "scored_during": statistics.mean(r.get("perf/scored_during_generation", 0.0) for r in steady),
    }


def _print_job(stream: bool, s: dict) -> None:
    print(
        f"  reward.stream={str(stream).lower()}: {s['step_s']:.3f} s/step; generate {s['generate_s']:.3f} s, "
        f"reward {s['reward_s']:.3f} s; scored during generation {s['scored_during']:.2f}"
    )


def _print_timeline(out: Path, step: int) -> None:
    rows = [json.loads(line) for line in (out / "timeline" / "rank0.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] == step and r["node"] in ("generate", "reward_stream", "reward")]
    t0 = min(r["start"] for r in rows)
    cells = [f"{r['node']} {r['start'] - t0:.2f}-{r['end'] - t0:.2f}" for r in rows]
    print(f"    rank 0, step {step} (seconds from generate's start): " + "; ".join(cells))


if __name__ == "__main__":
    main()
