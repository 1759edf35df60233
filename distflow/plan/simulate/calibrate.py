"""Measures this machine's profile (`python -m distflow.plan [CONFIG] --calibrate OUT.json`): memory copy,
serialization per MB and per object, gloo point-to-point bandwidth (one way and both ways at once) and
latency, all-gather latency, matmul FLOP/s, a scorer's cost per sample, and, given a model directory,
an SGLang engine's decode iteration, per-request and weight-update cost (engine_probe.py) and a forward of the
model. Each entry's source names the measurement. Takes about half a minute (a minute with an engine).

On a CPU machine the "device" is a core: flops is one thread's fp32 matmul rate, hbm_bandwidth the memory
copy rate. Intra-node links are gloo over loopback (both ways at once, as the data plane's peers send);
there is no inter-node link, so it repeats the intra-node one. The driver's NIC is gloo one way into one
process (as a single controller's gathers arrive).
"""

import json
import os
import pickle
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distflow.plan.simulate import megatron_probe
from distflow.plan.simulate.best_time import median_of_launches, median_seconds
from distflow.plan.simulate.engine_probe import measure_engine, measure_engines_at_once
from distflow.plan.simulate.hardware_profile import Knobs
from distflow.rewards.pool import RewardPool, RewardSample
from distflow.rewards.registry import load_scorer, scorer_path
from distflow.testing.launch import torchrun

MiB = 2**20
P2P_BYTES = 32 * MiB


def measure_memcpy(nbytes: int = 64 * MiB) -> float:
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return nbytes / median_seconds(lambda: dst.copy_(src))


def measure_serialization(nbytes: int = 32 * MiB, objects: int = 20000) -> tuple[float, float]:
    """(bytes/s of pickling and unpickling a tensor payload, seconds per small per-sample record)."""
    payload = {"input_ids": torch.ones(nbytes // 8, dtype=torch.int64)}
    per_mb = median_seconds(lambda: pickle.loads(pickle.dumps(payload)))
    records = [{"id": i, "group": i // 8, "length": 100 + i % 50, "score": 0.5} for i in range(objects)]
    per_object = median_seconds(lambda: pickle.loads(pickle.dumps(records)), repeats=3) / objects
    return nbytes / per_mb, per_object


def measure_matmul_flops(n: int = 512) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / median_seconds(lambda: a @ b)


def synthetic_answers(cfg, samples: int) -> tuple[str, list[tuple[str, str]]]:
    """(data_source, [(answer, ground truth)]) for timing the config's scorer (reward.name; auto: the MATH
    scorer's source)."""
    name = cfg.reward.name if cfg is not None else "math"
    source = "DigitalLearningGmbH/MATH-lighteval" if name == "auto" else ""
    return source, [(f"so the answer is \\boxed{{{i % 97}}}", str(i % 89)) for i in range(samples)]


def measure_scorer(cfg, samples: int = 2000) -> tuple[float, str]:
    """Seconds per sample of the config's scorer (reward.name; auto: the MATH scorer) on synthetic answers."""
    name = cfg.reward.name if cfg is not None else "math"
    source, answers = synthetic_answers(cfg, samples)
    scorer = load_scorer(
        scorer_path(name if name != "auto" else "auto", cfg.reward.custom if cfg else None, source)
    )
    start = time.perf_counter()
    for answer, truth in answers:
        scorer(answer, truth, data_source=source)
    return (time.perf_counter() - start) / samples, scorer.path


def measure_reward_pool(cfg, samples: int = 256, repeats: int = 3) -> dict:
    """Seconds per sample of a batch scored as a rank scores its samples: through a RewardPool with the
    config's reward.num_workers worker processes (score_batch: a pipe message to a worker and one back per
    sample, the workers' dispatch, the scorer itself), the median of `repeats` batches after a warm-up.
    On a small scorer the messages cost far more than the scoring (the copy task: ~0.1 ms a sample against
    ~3 us), and they run on the rank's own core."""
    source, answers = synthetic_answers(cfg, samples)
    batch = [RewardSample(answer, truth, source, True) for answer, truth in answers]
    pool = RewardPool.from_config(cfg.reward)
    try:
        return {
            "reward_pool_s_per_sample": median_seconds(lambda: pool.score_batch(batch), repeats=repeats)
            / samples,
            "reward_pool_workers": cfg.reward.num_workers,
        }
    finally:
        pool.close()


def _gloo_worker(rank: int, init_file: str, out):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    peer = 1 - rank
    small = torch.zeros(1)
    big_out, big_in = torch.ones(P2P_BYTES // 4), torch.empty(P2P_BYTES // 4)

    def round_trip() -> float:
        start = time.perf_counter()
        if rank == 0:
            dist.send(small, peer)
            dist.recv(small, peer)
        else:
            dist.recv(small, peer)
            dist.send(small, peer)
        return time.perf_counter() - start

    def one_way():
        (dist.send if rank == 0 else dist.recv)(big_out if rank == 0 else big_in, peer)
        dist.barrier()

    def both_ways():
        ops = [dist.P2POp(dist.isend, big_out, peer), dist.P2POp(dist.irecv, big_in, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    parts = [torch.zeros(16) for _ in range(2)]

    def allgather():
        for _ in range(100):
            dist.all_gather(parts, small.expand(16).contiguous())

    barrier_s = median_seconds(lambda: dist.barrier())
    results = {
        # The median of single round trips: a shared machine's preemptions land in the tail, not the median.
        "latency": statistics.median(round_trip() for _ in range(300)) / 2,
        "one_way": P2P_BYTES / (median_seconds(one_way) - barrier_s),
        "both_ways": P2P_BYTES / median_seconds(both_ways),
        "allgather_latency": median_seconds(allgather) / 100,
    }
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def measure_gloo() -> dict:
    """Point-to-point and all-gather costs between two processes of this machine over gloo."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_gloo_worker, args=(r, os.path.join(tmp, "init"), out)) for r in range(2)]
        for p in procs:
            p.start()
        results = out.get(timeout=300)
        for p in procs:
            p.join(60)
    return results


CROWD_RANKS = (2, 4, 8)
# gloo's figures are each the median over this many launches of their processes (best_time.median_of_launches)
GLOO_LAUNCHES = 3
CROWD_SLOT_BYTES = 32 * 1024  # the data plane's metadata slot for a few thousand samples (gather.py)
# A rank's share of the data-plane bench's batch (37 MiB over 2-8 ranks) and of a step's rollout
CROWD_EXCHANGE_BYTES = 16 * MiB


def _gloo_crowd_worker(rank: int, world: int, init_file: str, out):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    slot = torch.zeros(CROWD_SLOT_BYTES, dtype=torch.uint8)
    parts = [torch.empty_like(slot) for _ in range(world)]
    # every process sends a slice to every other one and receives one from each (a redistribution's
    # many-to-many pattern), CROWD_EXCHANGE_BYTES in each direction per process
    piece = CROWD_EXCHANGE_BYTES // (world - 1)
    peers = [r for r in range(world) if r != rank]
    outs = {r: torch.ones(piece, dtype=torch.uint8) for r in peers}

    def timed(fn, repeats: int) -> tuple[float, float]:
        """Medians over repeats, each starting from a barrier: (from the barrier to the last rank done, by
        each rank's own clock: what a phase that starts a round costs, as the benches time a round; from
        the last rank's entry to the last rank's exit: what a phase inside a chain adds, its ranks
        arriving from work of their own). Ranks leave a barrier of N processes on fewer cores
        milliseconds apart (3 ms at 8 here), which the first counts and the second does not.
        perf_counter is CLOCK_MONOTONIC, one clock for every process of the host."""
        rounds, chained = [], []
        for i in range(repeats + 1):
            dist.barrier()
            start = time.perf_counter()
            fn()
            end = time.perf_counter()
            # [the slowest rank's own time, the last entry, the last exit]
            marks = torch.tensor([end - start, start, end], dtype=torch.float64)
            dist.all_reduce(marks, op=dist.ReduceOp.MAX)
            if i:  # the first is a warm-up
                rounds.append(float(marks[0]))
                chained.append(float(marks[2] - marks[1]))
        return statistics.median(rounds), statistics.median(chained)

    def exchange():
        # received into buffers allocated for this exchange, as the data plane's Receiver preallocates each
        # transfer's consumer batch: their pages are first touched by the receive (20-50% slower here
        # than into buffers reused from the last exchange)
        ins = {r: torch.empty(piece, dtype=torch.uint8) for r in peers}
        ops = [dist.P2POp(dist.isend, outs[r], r) for r in peers]
        ops += [dist.P2POp(dist.irecv, ins[r], r) for r in peers]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    # the weight resharder's status exchange (RankErrors.exchange): an all_gather_object of (error, a few
    # numbers), i.e. pickling, an all-gather of sizes and one of the padded bytes
    statuses = [None] * world
    size, sizes = torch.zeros(1, dtype=torch.long), [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    status = (None, {"seconds": 0.1, "sent": 123456789, "group_sent": 0})

    allgather_object = timed(lambda: dist.all_gather_object(statuses, status), 20)
    barrier = timed(dist.barrier, 20)
    results = {
        "allgather_s": timed(lambda: dist.all_gather(parts, slot), 20)[0],
        "allgather_object_s": allgather_object[0],
        "allgather_object_chained_s": allgather_object[1],
        "barrier_s": barrier[0],
        "barrier_chained_s": barrier[1],
        # a gather of one number per rank into rank 0 (a single controller's gather of the shards' sizes)
        "gather_s": timed(lambda: dist.gather(size, sizes if rank == 0 else None, dst=0), 20)[0],
        "both_ways": piece * len(peers) / timed(exchange, 10)[0],
    }
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def measure_gloo_crowd(ranks=CROWD_RANKS) -> dict:
    """{N: costs} of N gloo processes on this host at once (more processes than cores on a small machine):
    an all-gather of a 32 KiB slot per rank (the data plane's metadata all-gather), an all_gather_object
    of a small status (the weight resharder's exchange), a barrier, a gather of one number per rank into
    rank 0, and every process
    sending 16 MiB spread over all the others while receiving as much (a redistribution's many-to-many
    pattern, all at once, into freshly allocated buffers): per process bytes/s each way. Each timed as a
    round's first phase (from a barrier); the all_gather_object and the barrier also inside a chain
    (`*_chained_s`: from the last rank's arrival), as the weight resharder's exchanges and a bench's
    closing barrier are.
    Measured rather than derived from the 2-process figures: with more processes than cores a collective
    waits for every process to be scheduled, hop after hop, which no per-message latency scaled by
    ranks / cores describes."""
    ctx = mp.get_context("spawn")
    results = {}
    for world in ranks:
        out = ctx.Queue()
        with tempfile.TemporaryDirectory() as tmp:
            init = os.path.join(tmp, "init")
            procs = [ctx.Process(target=_gloo_crowd_worker, args=(r, world, init, out)) for r in range(world)]
            for p in procs:
                p.start()
            results[str(world)] = out.get(timeout=300)
            for p in procs:
                p.join(60)
    return results


def _copy_at_once_worker(index: int, barrier, out, nbytes: int, repeats: int):
    torch.set_num_threads(1)
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = {"alone": [], "at once": []}
    for _ in range(repeats):
        for mode in times:  # in turn, so a slow spell of the machine lands on both
            barrier.wait()
            if index == 0 or mode == "at once":
                start = time.perf_counter()
                dst.copy_(src)
                times[mode].append(time.perf_counter() - start)
    out.put({mode: statistics.median(t) for mode, t in times.items() if t})


def measure_copies_at_once(processes: int, nbytes: int = 64 * MiB, repeats: int = 9) -> float:
    """How many copies' worth of memory bandwidth `processes` processes copying at once get: processes x
    a 64 MiB copy's time alone / its time (the median over the processes) with all of them copying at once,
    one thread each. Cores that share the memory bandwidth give less than their number (1.6 for 2 cores
    here, where the same processes' matmuls give 2.0): the CPU work of N ranks that is mostly copies
    (packing and placing samples, writing weights) runs that much at once, not `cores`."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(target=_copy_at_once_worker, args=(i, barrier, out, nbytes, repeats))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    alone = next(r["alone"] for r in results if "alone" in r)
    return processes * alone / statistics.median(r["at once"] for r in results)


def _mapped_copy_worker(queue, out, nbytes: int, repeats: int):
    mp.set_sharing_strategy("file_system")
    dst = torch.empty(nbytes // 4)
    times = []
    for _ in range(repeats + 1):
        src = queue.get()  # a new mapping of the sender's shared-memory file
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
        del src  # unmapped: the next one maps the file again
    out.put(nbytes / statistics.median(times[1:]))


def measure_mapped_copy(nbytes: int = 64 * MiB, repeats: int = 5) -> float:
    """Bytes/s a process copies out of a shared-memory buffer that another process wrote and that it has
    just mapped, as an engine loads the weight sync's staging buffer each sync (the resharder hands it views
    of the buffer by file name; every page of the new mapping faults on its first read)."""
    ctx = mp.get_context("spawn")
    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        src = torch.ones(nbytes // 4).share_memory_()
        queue, out = ctx.Queue(), ctx.Queue()
        child = ctx.Process(target=_mapped_copy_worker, args=(queue, out, nbytes, repeats))
        child.start()
        for _ in range(repeats + 1):
            queue.put(src)
        rate = out.get(timeout=300)
        child.join(60)
    finally:
        mp.set_sharing_strategy(previous)
    return rate


def measure_megatron(config_args: list[str], cfg, knobs: Knobs = Knobs()) -> dict:
    """Megatron's forward and train step for the config's actor in its TP x PP layout (megatron_probe.py):
    a fixed cost per pass and a cost per token, from the batch of one step's rows at DP 1 and half of it."""
    rows = cfg.data.train_batch_size * cfg.rollout.n
    seq = max(
        2,
        round(
            knobs.prompt_length_fraction * cfg.data.max_prompt_length
            + knobs.response_length_fraction * cfg.rollout.max_new_tokens
        ),
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "megatron.json"
        torchrun(
            megatron_probe.__name__,
            module=True,
            nproc=cfg.actor.tp * cfg.actor.pp,
            args=[*config_args, "--rows", str(rows), "--seq", str(seq), "--out", str(out)],
            timeout_s=900,
            env={"PYTHONPATH": str(Path(megatron_probe.__file__).resolve().parents[3])},
        )
        runs = sorted(json.loads(out.read_text()).values(), key=lambda r: r["tokens"])
    small, large = runs
    fit = {}
    for kind in ("forward", "train"):
        per_token = max(0.0, (large[f"{kind}_s"] - small[f"{kind}_s"]) / (large["tokens"] - small["tokens"]))
        fit[f"{kind}_s_per_token"] = per_token
        fit[f"{kind}_fixed_s"] = max(0.0, large[f"{kind}_s"] - per_token * large["tokens"])
    return {**fit, "tp": cfg.actor.tp, "pp": cfg.actor.pp, "runs": runs}


def _entry(value: float, unit: str, source: str) -> dict:
    return {"value": float(value), "unit": unit, "source": source}


def calibrate(
    out: Path,
    model_dir: Optional[str] = None,
    cfg=None,
    config_args: Optional[list[str]] = None,
    knobs: Knobs = Knobs(),
) -> Path:
    """Measures and writes the profile JSON; returns its path. config_args (CONFIG.yaml key=value ...)
    with cfg: also time Megatron's passes for the config's actor."""
    cores = len(os.sched_getaffinity(0))
    memcpy = measure_memcpy()
    serialize_bw, per_object = measure_serialization()
    flops = measure_matmul_flops()
    gloo = median_of_launches(measure_gloo, GLOO_LAUNCHES)
    crowd = median_of_launches(measure_gloo_crowd, GLOO_LAUNCHES)
    reward_s, scorer = measure_scorer(cfg)
    here = f"measured by --calibrate on {os.uname().nodename} ({cores} cores)"
    launched = f"median of {GLOO_LAUNCHES} launches"
    profile = {
        "name": f"this machine: {os.uname().nodename}, {cores} CPU cores, gloo over loopback",
        "device": {
            "flops": _entry(flops, "FLOP/s", f"{here}: fp32 512x512 matmul, one thread"),
            "hbm_bandwidth": _entry(memcpy, "B/s", f"{here}: 64 MiB torch copy"),
            "memory": _entry(
                os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / cores, "B", f"{here}: RAM / cores"
            ),
        },
        "intra_node": {
            "bandwidth": _entry(
                gloo["both_ways"],
                "B/s",
                f"{here}: gloo, 2 processes sending 32 MiB to each other at once, {launched}",
            ),
            "latency": _entry(
                gloo["latency"], "s", f"{here}: gloo ping-pong of 4 bytes, half a round trip, {launched}"
            ),
        },
        "inter_node": {
            "bandwidth": _entry(gloo["both_ways"], "B/s", f"{here}: one machine, no network: as intra_node"),
            "latency": _entry(gloo["latency"], "s", f"{here}: one machine, no network: as intra_node"),
        },
        "gpus_per_node": _entry(cores * 64, "", f"{here}: one host; ranks per node are as many as launched"),
        "host": {
            "memcpy_bandwidth": _entry(memcpy, "B/s", f"{here}: 64 MiB torch copy"),
            "serialize_bandwidth": _entry(
                serialize_bw, "B/s", f"{here}: pickle.dumps + loads of a 32 MiB tensor"
            ),
            "serialize_per_object": _entry(
                per_object, "s", f"{here}: pickle.dumps + loads of 20000 small dicts"
            ),
            "rpc_latency": _entry(
                2 * gloo["latency"], "s", f"{here}: a gloo round trip (a call and its reply)"
            ),
            "driver_nic_bandwidth": _entry(
                gloo["one_way"], "B/s", f"{here}: gloo, 32 MiB one way into one process, {launched}"
            ),
            "reward_seconds_per_sample": _entry(reward_s, "s", f"{here}: {scorer} on 2000 synthetic answers"),
            "cores": _entry(cores, "", f"{here}: os.sched_getaffinity"),
        },
        "knobs": {
            "train_mfu": 1.0,
            "forward_mfu": 1.0,
            "prefill_mfu": 1.0,
            "decode_bandwidth_efficiency": 1.0,
        },
        "measured": {
            "allgather_latency_2_ranks": gloo["allgather_latency"],
            "gloo_by_ranks": crowd,
            "copies_at_once": measure_copies_at_once(cores),
        },
    }
    if cfg is not None:
        profile["measured"]["reward"] = measure_reward_pool(cfg)
    if model_dir:
        profile["measured"]["engine"] = measure_engine(model_dir)
        profile["measured"]["engine"]["staging_copy_bandwidth"] = measure_mapped_copy()
        profile["measured"]["engine"]["slowdown_by_engines"] = measure_engines_at_once(model_dir)
        if config_args and cfg is not None:
            profile["measured"]["megatron"] = measure_megatron(config_args, cfg, knobs)
        profile["measured"]["model_dir"] = str(model_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=2))
    return out
