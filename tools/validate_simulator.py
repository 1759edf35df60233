"""Checks the step simulator's pieces against what this machine measures: the data-plane bench (DataCoordinator
and its single-controller baseline) and the weight-sync bench at 2, 4 and 8 ranks, and the README main job's
step time at 2 ranks. Prints predicted vs measured and the error of each; the last line is a summary.

    python tools/validate_simulator.py                       # calibrates first (~1-2 min), then ~5 min of runs
    python tools/validate_simulator.py --profile outputs/calibration/cpu.json --skip-step

Predictions use only the calibrated profile (python -m distflow.plan CONFIG --calibrate) and the planner's
own data and reshard plans; nothing measured by a bench feeds its own prediction. The main job runs the
same torchrun command as ci/quickstart.sh (without its setup step), 8 steps; its first two (warm-up: the
first weight sync, Megatron's first passes, the engines' first batches) are left out of the measured
median, as the simulator predicts a steady-state step.
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist

import bench_data_plane as bench  # tools/, beside this script
import bench_weight_sync  # tools/, beside this script
import numpy as np
import torch
from main_job_inputs import MODEL, prepare_main_job_inputs  # tools/, beside this script

from distflow.config import resolve
from distflow.coordination.data.layouts import PlacedLayout
from distflow.coordination.data.transport import Receiver, outgoing
from distflow.coordination.weights import plan_weight_sync
from distflow.coordination.weights.regions import narrow
from distflow.coordination.weights.resharder import planned_writes
from distflow.layout import ParallelLayout, Placement
from distflow.models.conversion import HFCheckpoint
from distflow.models.registry import spec_for
from distflow.models.tiny import make_tiny_model
from distflow.plan.model_size import ModelArch
from distflow.plan.reshard_estimate import estimate_reshard
from distflow.plan.simulate import calibrate
from distflow.plan.simulate.best_time import median_seconds
from distflow.plan.simulate.data_movement import (
    Link,
    multi_controller_seconds,
    pipelined_sends,
    plan_edge,
)
from distflow.plan.simulate.hardware_profile import Knobs, load_profile
from distflow.plan.simulate.step import (
    allgather_seconds,
    copies_at_once,
    crowd_measurement,
    exchange_seconds,
    host_links,
    simulate_step,
)
from distflow.plan.simulate.weight_sync import weight_sync_seconds

REPO = Path(__file__).resolve().parents[1]
TOLERANCE = 0.25
MAIN_JOB_CONFIG = "examples/configs/grpo_copy_cpu.yaml"
MAIN_JOB_MODEL = MODEL  # as ci/quickstart.sh makes it (prepare_main_job_inputs)
# Steps 1-2 are the job's warm-up, left out: step 1 pays the first weight sync and Megatron's first
# passes (~1.1 s of training), and step 2's generation is ~2x the later ones (0.55-0.6 s against
# 0.27-0.35 s in every run of 2026-12-05: the engines' first batches of the trained policy); the median
# of steps 3-8 is the steady state the simulator predicts.
MAIN_JOB_STEPS = 8
MAIN_JOB_WARMUP_STEPS = 2


def steady_steps(steps: list[dict]) -> list[dict]:
    """The run's metrics rows after its warm-up steps."""
    return [s for s in steps if s.get("step", 0) > MAIN_JOB_WARMUP_STEPS]


# The copy task's lengths, by construction (tools/prepare_data.py copy --digits 4): a prompt is the chat
# template around 4 digits, "user\n1234\nassistant\n" (~22 tokens of data.max_prompt_length 64), the
# answer 4 digits + EOS (5 of rollout.max_new_tokens 8) once the policy has learnt it. The calibration's
# Megatron probe takes these; the step's prediction takes the run's own lengths (length_knobs).
MAIN_JOB_KNOBS = Knobs(
    prompt_length_fraction=22 / 64, response_length_fraction=5 / 8, response_length_sigma=0.05
)
# bench_data_plane.py's defaults, which its runs here keep
DP_PROMPTS, DP_SAMPLES, DP_SEED, DP_MIN, DP_MAX = 512, 8, 0, 64, 4096
DP_FIELDS = {"input_ids": "all", "rollout_logprobs": "all"}
# bench_weight_sync.py's model at each rank count: (tp, pp)
WS_LAYOUTS = {2: (2, 1), 4: (2, 2), 8: (4, 2)}
WS_MODEL = dict(layers=4, hidden=512, heads=8, kv_heads=4, ffn=1536, vocab=8000)


def run(cmd: list[str], timeout: int) -> str:
    # this checkout's distflow, also in the benches' torchrun ranks (a venv may have another installed)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
        )
    return out.stdout


# --- data plane -------------------------------------------------------------------------------------------


def bench_lengths() -> np.ndarray:
    """The bench's lengths: one seeded draw (tools/bench_data_plane.py, rollout_shard)."""
    rng = np.random.default_rng(DP_SEED)
    n = DP_PROMPTS * DP_SAMPLES
    return np.clip(rng.lognormal(np.log(512), 1.0, n), DP_MIN, DP_MAX).astype(np.int64)


def predict_data_plane(profile, ranks: int) -> tuple[float, float]:
    """(coordinator, baseline) seconds for the bench's edge: rollout DP=N -> training DP=N/2 x TP=2."""
    # The bench's processes keep the memory they free (bench.KEEP_FREED_MEMORY), so its rounds run on pages
    # they already have; so does this process, which times their CPU work below.
    bench.keep_freed_memory()
    placement = Placement.create("colocated", ranks, 1)
    producer = PlacedLayout.rollout(placement)
    consumer = PlacedLayout.training(ParallelLayout.for_world(ranks, tp=2), placement)
    lengths = bench_lengths()
    plan, planning_s = plan_edge(producer, consumer, lengths, DP_SAMPLES, DP_FIELDS)
    # N processes on the host's cores, whose copies share the memory bandwidth (copies_at_once)
    parallel = copies_at_once(profile)
    share = min(1.0, parallel / ranks)
    link, _ = host_links(profile, ranks)
    gather = allgather_seconds(ranks, link, link, ranks, profile)
    # Each rank's own CPU work besides the messages (sorting its batch, the plan, packing what it sends,
    # placing what it keeps and receives), timed here alone per rank. N ranks on C cores: the kernel
    # shares the cores, so the work ends no sooner than the busiest rank's own and than all ranks' work
    # spread over the copies the host runs at once (mostly copies); the messages then cross the shared link.
    work = rank_work_seconds(plan, planning_s, ranks)
    cpu = max(max(work), sum(work) / min(ranks, parallel))
    coordinator = multi_controller_seconds(plan, ranks, link, link, gather) + cpu
    # Baseline: what the bench's single_controller does (tools/bench_data_plane.py), not a Ray driver's
    # pickling (step.driver_of): every rank packs its shard with torch.cat (N ranks at once on the
    # cores, a memcpy each); rank 0 gathers the shards' sizes, then receives the other N - 1 shards (a
    # message each, gloo one way into one process), then unpacks, balances, selects and packs every consumer DP rank's share in its one
    # process (driver_shares: index copies of sample runs, slower than one memcpy, so timed here on the
    # bench's own shards, as the plan is), and sends each share to both TP ranks (a size and a payload
    # message each, gloo one way out of one process) while it makes the next (driver_pipeline). Whole
    # tensors: no per-sample objects.
    payload = float(lengths.sum()) * 12
    received = payload * (ranks - 1) / ranks
    nic, latency = profile.driver_nic_bandwidth.value, profile.intra_latency.value
    own_pack = payload / ranks / (profile.memcpy_bandwidth.value * share)
    # before the shards: rank 0 gathers their sizes (dist.gather, timed by --calibrate with N processes)
    crowd = crowd_measurement(profile, ranks) or {}
    sizes = crowd.get("gather_s", allgather_seconds(ranks, link, link, ranks, profile))
    gathered = sizes + received / nic + (ranks - 1) * latency
    baseline = (
        own_pack + gathered + driver_pipeline(time_driver_shares(ranks, consumer), consumer, nic, latency)
    )
    return coordinator, baseline


def driver_pipeline(shares: list[tuple[int, float, int]], consumer: PlacedLayout, nic: float, latency: float):
    """Seconds from rank 0's gather to its last send done: shares are (dp rank, seconds to make it, its
    bytes), in the order driver_shares yields them; each goes to the TP ranks of its DP rank but rank 0 (a
    size and a payload message each, posted with isend before the next share is made)."""
    return pipelined_sends(
        [
            (seconds, sum(dst != 0 for dst in consumer.dp_ranks(d)) * (nbytes / nic + 2 * latency))
            for d, seconds, nbytes in shares
        ]
    )


def bench_args() -> argparse.Namespace:
    """The bench's defaults that rollout_shard reads."""
    return argparse.Namespace(
        seed=DP_SEED, prompts=DP_PROMPTS, samples=DP_SAMPLES, min_len=DP_MIN, max_len=DP_MAX
    )


def rank_work_seconds(plan, planning_s: float, ranks: int) -> list[float]:
    """Each rank's CPU work in DataCoordinator._execute besides the metadata all-gather and the messages:
    sorting its batch by id, the plan (planning_s: the same on every rank), packing the runs it sends
    (transport.outgoing) and placing the runs it keeps and receives (transport.Receiver), on the bench's
    own shard with the real plan, timed alone in this process (the median of 5 after a warm-up). These
    copies are of sample runs, not one memcpy, so they are timed rather than taken at the memcpy rate."""
    out = []
    for rank in range(ranks):
        batch = bench.rollout_shard(bench_args(), rank, ranks)[0]

        def work():
            local = batch.sorted_by_id()
            outgoing(plan, rank, local, "cpu")
            receiver = Receiver(plan, rank, local, "cpu")
            receiver.copy_kept()
            receiver.finish()

        out.append(planning_s + median_seconds(work, repeats=5))
    return out


def time_driver_shares(ranks: int, consumer: PlacedLayout, repeats: int = 5) -> list[tuple[int, float, int]]:
    """Rank 0's work between gather and scatter in the bench's baseline (bench_data_plane.driver_shares),
    on the bench's own N shards, timed alone in this process share by share (the first share with the
    unpacking and balancing before it): (dp rank, median seconds over `repeats` runs after a warm-up,
    bytes)."""
    bufs = [bench._to_bytes(bench.rollout_shard(bench_args(), r, ranks)[0]) for r in range(ranks)]
    runs = []
    for _ in range(repeats + 1):
        run_, last = [], time.perf_counter()
        for d, payload in bench.driver_shares(bufs, consumer):
            now = time.perf_counter()
            run_.append((d, now - last, payload.numel()))
            last = time.perf_counter()  # the caller's sends are not the split's work
        runs.append(run_)
    return [
        (d, statistics.median(r[i][1] for r in runs[1:]), nbytes) for i, (d, _, nbytes) in enumerate(runs[0])
    ]


def measure_data_plane(ranks: int, repeats: int) -> tuple[float, float]:
    out = run(
        [sys.executable, "tools/bench_data_plane.py", "--ranks", str(ranks), "--repeats", str(repeats)], 600
    )
    walls = dict(re.findall(r"^(coordinator|baseline)\s+wall ([0-9.]+) s", out, re.M))
    return float(walls["coordinator"]), float(walls["baseline"])


# --- weight sync ------------------------------------------------------------------------------------------


def predict_weight_sync(profile, ranks: int, model_dir: Path) -> float:
    """The bench's resharder: tp x pp ranks write their slices into one engine (TP 1) over shared memory,
    fp32 on the wire (the bench's element_size=4), then the engine loads them."""
    arch = ModelArch.from_json(str(model_dir))
    tp, pp = WS_LAYOUTS[ranks]
    reshard = estimate_reshard(arch, ParallelLayout.for_world(ranks, tp=tp, pp=pp), 1, 1, 64, 1.0)
    fp32 = replace(reshard, send_bytes=2 * reshard.send_bytes, recv_bytes=2 * reshard.recv_bytes)
    # Every rank writes its slices into the engine's shared-memory staging buffer itself, all at once. The
    # slices are row ranges of head groups and halves of rows, not one memcpy: each rank's writes are
    # timed alone here (staging_write_seconds), and N ranks on C cores write no sooner than the busiest
    # rank alone and than all ranks' writes spread over the copies the host runs at once (copies_at_once,
    # as the data plane's rank work). The links carry the busiest rank's bytes and the engine's in that time.
    writes = staging_write_seconds(model_dir, ranks)
    seconds = max(max(writes), sum(writes) / min(ranks, copies_at_once(profile)))
    copy = Link(fp32.send_bytes / seconds, profile.rpc_latency.value)
    into_engine = Link(fp32.recv_bytes / seconds, profile.rpc_latency.value)
    memcpy = profile.memcpy_bandwidth.value
    link, _ = host_links(profile, ranks)
    sync = weight_sync_seconds(
        fp32,
        arch,
        copy,
        memcpy,
        profile.measured.get("engine", {}),
        exchange_seconds(ranks, link, link, ranks, profile),
        engine_link=into_engine,
    )
    # the bench times each sync from a barrier to a barrier after it (bench_weight_sync.timed): the one
    # after it is inside the time, its ranks arriving from the sync (chained)
    crowd = crowd_measurement(profile, ranks) or {}
    closing = crowd.get("barrier_chained_s") or crowd.get("barrier_s")
    return sync + (closing or allgather_seconds(ranks, link, link, ranks, profile))


def staging_write_seconds(model_dir: Path, ranks: int, repeats: int = 7) -> list[float]:
    """Each rank's writes of one sync into the engine's staging buffer (the bench's plan and Megatron shards:
    resharder.planned_writes, SharedMemoryTransport.stage's copies), timed alone per rank in this process
    into buffers of its own (the median of `repeats` after a warm-up)."""
    checkpoint = HFCheckpoint(str(model_dir))
    spec, cfg = spec_for(checkpoint.config), checkpoint.config
    tp, pp = WS_LAYOUTS[ranks]
    train = ParallelLayout.for_world(ranks, tp=tp, pp=pp)
    placement = Placement(
        kind="colocated", world_size=ranks, train_ranks=tuple(range(ranks)), rollout_ranks=(0,), engine_tp=1
    )
    plan = plan_weight_sync(spec, cfg, train, placement, bucket_bytes=64 * 2**20, element_size=4)
    buffers = {
        (b, e, r): torch.empty(sum(t.numel for t in plan.bucket_targets(b, e, r)))
        for b in range(len(plan.buckets))
        for e, engine_ranks in enumerate(plan.engines)
        for r in range(len(engine_ranks))
    }
    out = []
    for rank in range(ranks):
        local = bench_weight_sync.local_shards(spec, checkpoint, train, rank)
        writes, _ = planned_writes(plan, rank)

        def write():
            for b, items in writes.items():
                for e, r, target, offset, piece in items:
                    staged = buffers[(b, e, r)][offset : offset + target.numel].view(target.shape)
                    narrow(staged, piece.dst).copy_(narrow(local[piece.src_name], piece.src))

        out.append(median_seconds(write, repeats=repeats))
    return out


def measure_weight_sync(ranks: int, repeats: int) -> float:
    tp, pp = WS_LAYOUTS[ranks]
    m = WS_MODEL
    out = run(
        [
            sys.executable,
            "tools/bench_weight_sync.py",
            "--tp",
            str(tp),
            "--pp",
            str(pp),
            "--engine-tp",
            "1",
            "--layers",
            str(m["layers"]),
            "--hidden",
            str(m["hidden"]),
            "--heads",
            str(m["heads"]),
            "--kv-heads",
            str(m["kv_heads"]),
            "--vocab",
            str(m["vocab"]),
            "--repeats",
            str(repeats),
        ],
        900,
    )
    return float(re.search(r"resharder:\s+([0-9.]+) ms", out).group(1)) / 1e3


# --- the README main job ----------------------------------------------------------------------------------


def predict_main_job(profile) -> float:
    cfg = resolve(str(REPO / MAIN_JOB_CONFIG), [f"model.path={REPO / MAIN_JOB_MODEL}"])
    arch = ModelArch.from_json(str(REPO / MAIN_JOB_MODEL))
    return simulate_step(cfg, arch, 2, profile, "multi")


def length_knobs(steps: list[dict], knobs: Knobs) -> Knobs:
    """The length knobs of the run's steady steps (their medians): the mean response and prompt lengths over
    their bounds, and the spread that puts the longest of a step's samples at the measured maximum (the
    top quantile of a log-normal: the model draws a step's lengths at its quantiles). Lengths are the data's
    and the policy's, not a timing: the step time stays a prediction."""
    cfg = resolve(str(REPO / MAIN_JOB_CONFIG), [f"model.path={REPO / MAIN_JOB_MODEL}"])
    steady = steady_steps(steps)

    def median(key):
        return statistics.median(s[key] for s in steady)

    mean, longest = median("rollout/response_length/mean"), median("rollout/response_length/max")
    samples = cfg.data.train_batch_size * cfg.rollout.n
    top = NormalDist().inv_cdf((samples - 0.5) / samples)
    return replace(
        knobs,
        response_length_fraction=mean / cfg.rollout.max_new_tokens,
        response_length_sigma=max(0.0, math.log(longest / mean)) / top,
        prompt_length_fraction=median("rollout/prompt_length/mean") / cfg.data.max_prompt_length,
    )


def measure_main_job() -> float:
    out_dir = REPO / "outputs" / "validate_simulator_main_job"
    subprocess.run(["rm", "-rf", str(out_dir)], check=True)
    run(
        [
            "timeout",
            "900",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "distflow.train",
            MAIN_JOB_CONFIG,
            f"model.path={MAIN_JOB_MODEL}",
            f"trainer.output_dir={out_dir}",
            f"trainer.total_steps={MAIN_JOB_STEPS}",
        ],
        960,
    )
    steps = [
        json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    return statistics.median(s["timing_s/step"] for s in steady_steps(steps) if "timing_s/step" in s), steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="a calibrated profile JSON (default: calibrate now)")
    parser.add_argument("--ranks", default="2,4,8")
    # timed rounds of each bench (medians): a round takes 20-120 ms, and a median of many rounds moves less
    # between runs on a shared machine than one of a few
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--skip-data-plane", action="store_true")
    parser.add_argument("--skip-weight-sync", action="store_true")
    parser.add_argument("--skip-step", action="store_true")
    args = parser.parse_args(argv)
    prepare_main_job_inputs()  # the calibration's engine and Megatron probe, and the main job, run its model
    path = args.profile
    if not path:
        path = REPO / "outputs" / "calibration" / "cpu.json"
        args_ = [str(REPO / MAIN_JOB_CONFIG), f"model.path={REPO / MAIN_JOB_MODEL}"]
        cfg = resolve(args_[0], args_[1:])
        calibrate.calibrate(
            path, model_dir=str(REPO / MAIN_JOB_MODEL), cfg=cfg, config_args=args_, knobs=MAIN_JOB_KNOBS
        )
        print(f"calibrated: {path}", flush=True)
    profile = load_profile(str(path), MAIN_JOB_KNOBS)
    rows = []  # (what, predicted, measured)

    def record(what, predicted, measured):
        rows.append((what, predicted, measured))
        print(
            f"{what:<44} predicted {predicted * 1e3:9.1f} ms  measured {measured * 1e3:9.1f} ms  "
            f"error {(predicted - measured) / measured:+7.1%}",
            flush=True,
        )

    ranks = [int(r) for r in args.ranks.split(",")]
    for n in [] if args.skip_data_plane else ranks:
        coordinator, baseline = measure_data_plane(n, args.repeats)
        p_coordinator, p_baseline = predict_data_plane(profile, n)
        record(f"data plane, multi-controller, {n} ranks", p_coordinator, coordinator)
        record(f"data plane, single-controller, {n} ranks", p_baseline, baseline)
    if not args.skip_weight_sync:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = make_tiny_model("qwen2", Path(tmp) / "m", **WS_MODEL)
            for n in ranks:
                record(
                    f"weight sync (resharder), {n} ranks",
                    predict_weight_sync(profile, n, model_dir),
                    measure_weight_sync(n, args.repeats),
                )
    if not args.skip_step:
        measured, steps = measure_main_job()
        # the data's lengths, as docs/scaling.md tells a user to set them: from the run's rollout metrics
        knobs = length_knobs(steps, MAIN_JOB_KNOBS)
        print(
            f"  length knobs from the run: response_length_fraction={knobs.response_length_fraction:.3f} "
            f"response_length_sigma={knobs.response_length_sigma:.3f} "
            f"prompt_length_fraction={knobs.prompt_length_fraction:.3f}",
            flush=True,
        )
        predicted = predict_main_job(load_profile(str(path), knobs))
        for phase, seconds in predicted.phases.items():
            print(f"  predicted {phase:<9} {seconds:7.3f} s", flush=True)
        steady = steady_steps(steps)
        keys = sorted({k for s in steady for k in s if k.startswith("timing_s/")})
        print(
            f"  measured  (median of steps {MAIN_JOB_WARMUP_STEPS + 1}-{MAIN_JOB_STEPS}) "
            + ", ".join(f"{k[9:]}={statistics.median(s[k] for s in steady if k in s):.3f}" for k in keys)
        )
        record("README main job, step time, 2 ranks", predicted.seconds, measured)
    if not rows:  # every part skipped: the calibration alone
        return
    errors = [abs(p - m) / m for _, p, m in rows]
    within = sum(e <= TOLERANCE for e in errors)
    print(
        f"summary: {within}/{len(rows)} within {TOLERANCE:.0%}; median |error| {statistics.median(errors):.1%}, "
        f"max |error| {max(errors):.1%} ({rows[int(np.argmax(errors))][0]})"
    )


if __name__ == "__main__":
    main()
