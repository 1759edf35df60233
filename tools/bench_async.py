"""Benchmarks bounded staleness: the same tiny GRPO job on CPU at rollout.max_staleness 0, 1 and 2, in one run.

Example: python tools/bench_async.py --steps 12          (add partial rollouts: --staleness 0,1,1p)
         python tools/bench_async.py --staleness 0,0s,1 --kl-coef 0.01 --mini-batches 2
                                        (lock-step with the samples streamed to the trainer: 0s)

Each job is `distflow.train` on the copy task (examples/configs/grpo_copy_cpu.yaml) in the disaggregated
placement, 2 processes: rank 0 trains (Megatron actor, TP=1), rank 1 hosts one SGLang engine (TP=1), one
thread each. At max_staleness 0 they take turns (the engine idles while the actor trains, and the other way
round); at k > 0 the engine generates the next k batches while the actor trains, so a step costs about
max(generation, training) instead of their sum: the limit is 2x when the two take equal time. A level "kp"
runs k with partial rollouts (rollout.partial): the weight sync interrupts the generation in flight, which
continues under the new weights (rollout/partial_fraction: the share of tokens sampled before a sync). The default
sizes make them about equal on this 2-core machine. With more busy processes than cores, the overlap is
bounded by the cores, not by DistFlow: keep one training rank and one engine rank on 2 cores. A level "0s"
is lock-step with the samples moving to the actor in parts while the engine generates (--stream-chunks parts:
the actor's old- and reference-log-prob passes run on them as they arrive); it needs those passes
(--kl-coef > 0 for the reference, --mini-batches > 1 for the old log-probs). Every other level moves the
batch whole (stream_chunks=1).

The first --skip steps (start-up, and the batches generated before anything can overlap) are left out of
the rates, and a job at staleness k runs k steps more than --steps so that every measured step generates
ahead, as in a long run. Printed per job: steps/s, generated tokens/s, seconds per node, the idle ratios, and one steady
step's timeline from the per-rank timeline files (<output_dir>/timeline/rank<k>.jsonl) with the seconds
the actor's passes overlapped the engine's generation. Last line: the ratios over staleness 0.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from distflow.models.tiny import make_tiny_model
from distflow.testing.copy_task import copy_job_args
from distflow.testing.launch import REPO_ROOT as REPO
from distflow.testing.launch import run, torchrun

TRAINING_NODES = ("old_logprob", "ref_logprob", "train_actor", "stream_logprobs")
ROLLOUT_NODES = ("generate", "reward")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="RL steps per job")
    parser.add_argument("--skip", type=int, default=3, help="first steps left out of the rates")
    parser.add_argument(
        "--staleness",
        default="0,1,2",
        help="the max_staleness values, comma-separated; 'kp': k with partial rollouts; '0s': 0 streamed",
    )
    parser.add_argument(
        "--stream-chunks", type=int, default=4, help="rollout.stream_chunks of the '0s' level"
    )
    parser.add_argument(
        "--kl-coef", type=float, default=0.0, help="algorithm.kl_coef (> 0: a reference pass)"
    )
    parser.add_argument(
        "--mini-batches", type=int, default=1, help="optimizer steps per batch (> 1: an old-log-prob pass)"
    )
    parser.add_argument("--batch", type=int, default=16, help="prompts per step (data.train_batch_size)")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256, help="tiny model width (its FFN is 4x)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--digits", type=int, default=4, help="copy-task string length (the longest)")
    parser.add_argument(
        "--min-digits",
        type=int,
        default=None,
        help="the shortest (default --digits): responses of many lengths",
    )
    parser.add_argument(
        "--sft-warmup",
        type=int,
        default=0,
        help="trainer.sft_warmup_steps (so the model stops where it should)",
    )
    parser.add_argument("--work-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--timeout-s", type=float, default=900, help="per job")
    args = parser.parse_args(argv)
    if args.steps <= args.skip + 1:
        parser.error(f"--steps={args.steps} must exceed --skip={args.skip} + 1 to leave steps to measure")
    levels = [level.strip() for level in args.staleness.split(",")]
    for level in levels:
        if not level.rstrip("ps").isdigit() or level == "0p" or (level.endswith("s") and level != "0s"):
            parser.error(
                f"--staleness: {level!r} is not k, kp or 0s (k >= 0; kp: k >= 1 with partial rollouts; "
                "0s: lock-step, streamed to the trainer)"
            )
    if "0s" in levels and args.kl_coef == 0 and args.mini_batches == 1:
        parser.error("--staleness 0s streams the log-prob passes: give --kl-coef > 0 or --mini-batches > 1")
    if args.batch % args.mini_batches:
        parser.error(f"--mini-batches={args.mini_batches} must divide --batch={args.batch}")
    if "0" not in levels:
        levels.insert(0, "0")  # the baseline the ratios are over

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_async_"))
    model, data = _task(work, args)
    results = {}
    for k in levels:
        out = work / f"staleness_{k}"
        shutil.rmtree(out, ignore_errors=True)  # a --work-dir used before: its checkpoints would be resumed
        print(f"[bench_async] max_staleness={k}: {args.steps} steps ...", flush=True)
        _train(model, data, out, k, args)
        results[k] = _summarize(out, args.skip, args.steps)
        _print_job(k, results[k])
        _print_timeline(out, args.steps - 1)
    base = results["0"]
    ratios = ", ".join(
        f"max_staleness={k}: {results[k]['steps_per_s'] / base['steps_per_s']:.2f}x steps/s, "
        f"{results[k]['tokens_per_s'] / base['tokens_per_s']:.2f}x tokens/s"
        for k in levels
        if k != "0"
    )
    print(f"ratios over max_staleness=0 ({len(base['steps'])} steady steps each): {ratios}")


def _task(work: Path, args) -> tuple[Path, Path]:
    model = make_tiny_model(
        "qwen2",
        work / "model",
        vocab=300,
        hidden=args.hidden,
        ffn=4 * args.hidden,
        layers=args.layers,
        heads=4,
        kv_heads=2,
    )
    shortest = args.min_digits or args.digits
    data = work / f"copy_{shortest}-{args.digits}"
    if not (data / "train.parquet").is_file():
        prompts = str(args.batch * (args.steps + 2 + args.sft_warmup))
        run(
            [sys.executable, REPO / "tools/prepare_data.py", "copy", "--out", data]
            + ["--digits", str(args.digits), "--min-digits", str(shortest)]
            + ["--train", prompts, "--test", "8", "--seed", "1"],
            timeout_s=300,
        )
    return model, data


def _train(model: Path, data: Path, out: Path, level: str, args) -> None:
    k, partial, streamed = int(level.rstrip("ps")), level.endswith("p"), level.endswith("s")
    torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=args.timeout_s,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=str(REPO),
        args=[
            *copy_job_args(model, data, out),
            f"trainer.sft_warmup_steps={args.sft_warmup}",
            "rollout.placement=disaggregated",
            "rollout.num_ranks=1",
            "actor.tp=1",
            f"rollout.max_staleness={k}",
            f"rollout.partial={str(partial).lower()}",
            f"rollout.stream_chunks={args.stream_chunks if streamed else 1}",
            f"algorithm.kl_coef={args.kl_coef}",
            f"actor.mini_batch_size={args.batch // args.mini_batches}",
            f"data.train_batch_size={args.batch}",
            f"rollout.n={args.n}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            # k more steps: the measured steps all generate ahead, as in a long run (the last k have nothing to)
            f"trainer.total_steps={args.steps + k}",
            "checkpoint.save_every=0",
            "checkpoint.keep_last=1",
            "checkpoint.export_hf=false",
            "tracking.backends=[jsonl]",
        ],
    )


def _summarize(out: Path, skip: int, steps: int) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in rows if skip < r["step"] <= steps]
    seconds = sum(r["timing_s/step"] for r in steady)
    nodes = sorted({k.removeprefix("timing_s/") for r in steady for k in r if k.startswith("timing_s/")})
    return {
        "steps": [r["step"] for r in steady],
        "steps_per_s": len(steady) / seconds,
        "tokens_per_s": sum(r["rollout/tokens"] for r in steady) / seconds,
        "node_s": {n: statistics.mean(r.get(f"timing_s/{n}", 0.0) for r in steady) for n in nodes},
        # Not recorded with partial rollouts (the engine generates while its rank waits in the sync).
        "engine_idle": statistics.mean(r.get("perf/engine_idle_ratio", float("nan")) for r in steady),
        "trainer_idle": statistics.mean(r["perf/trainer_idle_ratio"] for r in steady),
        "staleness_max": max(r["rollout/staleness_max"] for r in steady),
        "reward": statistics.mean(r["reward/mean"] for r in steady),
        "partial_fraction": statistics.mean(r.get("rollout/partial_fraction", 0.0) for r in steady),
    }


def _print_job(k: str, s: dict) -> None:
    nodes = ", ".join(f"{n} {v:.3f}" for n, v in s["node_s"].items() if n != "step")
    print(
        f"  max_staleness={k}: {s['steps_per_s']:.3f} steps/s, {s['tokens_per_s']:.0f} tokens/s, "
        f"{s['node_s']['step']:.3f} s/step; idle: engine {s['engine_idle']:.2f}, trainer "
        f"{s['trainer_idle']:.2f}; staleness max {s['staleness_max']:.0f}; partial tokens "
        f"{s['partial_fraction']:.2f}; reward {s['reward']:.3f}\n"
        f"    seconds per node (the slowest rank): {nodes}"
    )


def _print_timeline(out: Path, step: int) -> None:
    """Step `step` as each rank ran it, and how long the actor's passes overlapped the engine's generation."""
    spans = {}
    for path in sorted((out / "timeline").glob("rank*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        spans[path.stem] = [r for r in rows if r["step"] == step]
    t0 = min(r["start"] for rows in spans.values() for r in rows)
    print(
        f"    timeline of step {step} (seconds from its start; 'for' = the step whose data a node worked on):"
    )
    for rank, rows in spans.items():
        cells = [
            f"{r['node']}[for {r['for_step']}] {r['start'] - t0:.2f}-{r['end'] - t0:.2f}"
            for r in rows
            if r["end"] - r["start"] >= 0.005
        ]
        print(f"      {rank}: " + "; ".join(cells))
    every = [r for rows in spans.values() for r in rows]
    generating = [r for r in every if r["node"] in ROLLOUT_NODES]
    training = [r for r in every if r["node"] in TRAINING_NODES]
    overlap = sum(
        max(0.0, min(a["end"], b["end"]) - max(a["start"], b["start"])) for a in training for b in generating
    )
    busy = sum(r["end"] - r["start"] for r in training)
    print(f"    overlap: the actor's passes ran {overlap:.2f} s of their {busy:.2f} s alongside generation")


if __name__ == "__main__":
    main()
