"""Benchmarks the data plane: a long-tailed rollout batch moves from a DP=N rollout layout to a training
layout DP=N/2 x TP=2, once with the DataCoordinator and once with a single-controller baseline (rank 0
gathers everything, balances and splits it, and scatters each training rank its share), in the same run.

Example: python tools/bench_data_plane.py --ranks 8     (launches its own N CPU processes over gloo)

Per method it prints the wall time (slowest rank, median over repeats, each round starting from a
barrier and ending when the last rank has its data), the traffic of the busiest rank (bytes sent +
received) against the total, and the token imbalance over consumer DP ranks (max/mean). The last line
has the ratios: baseline time / coordinator time; busiest rank's traffic / (total traffic / N), i.e.
max/mean traffic (1.0 = spread evenly), and as a second view the busiest rank's larger direction (sent or
received) / (batch bytes / N); and the imbalance. The coordinator's figures come first, the baseline's
beside them. BENCH_TIMELINE=1 also prints each rank's transfer timeline (gathered, planned, posted,
received, done, in ms), and rank 0's page faults in each baseline round. Its processes keep the memory
they free (KEEP_FREED_MEMORY).
"""

import argparse
import ctypes
import ctypes.util
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from distflow.coordination.data import DataCoordinator, DataEdge, FieldPlacement, PackedBatch, PlacedLayout
from distflow.coordination.data.balance import balanced_partition, imbalance
from distflow.layout import ParallelLayout, Placement
from distflow.testing.launch import torchrun

MiB = 2**20
FIELDS = FieldPlacement.standard("input_ids", rollout_logprobs="all")
# glibc's malloc, left to itself, hands large freed blocks back to the kernel (allocations above its mmap
# threshold, at most 32 MiB, and a heap top above its trim threshold), so a round's tensors land on pages the
# process must fault in again (about 2 us a 4 KiB page here) or on reused ones, as the previous rounds left
# the heap. Measured (BENCH_TIMELINE): the baseline's rank 0 faulted 0 to 35 k pages a round at 4 and 8
# ranks, and its rounds took 50 to 110 ms by that alone; at 2 ranks every round mapped its 39 MB share anew.
# The bench's processes keep what they free, so every round after the warm-up runs on pages it already has,
# for both methods alike.
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**30)}


def keep_freed_memory():
    """KEEP_FREED_MEMORY for this process, which has already started (tools/validate_simulator.py, timing the
    bench's CPU work): glibc's mallopt. M_TRIM_THRESHOLD is -1 and M_MMAP_THRESHOLD -3 in malloc.h."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    for option in (-1, -3):
        if not libc.mallopt(option, 2**30):
            raise RuntimeError(f"glibc refused mallopt({option}, 2**30)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="processes to launch (even)")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (a group)")
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round")
    parser.add_argument("--tolerance", type=float, default=0.01, help="accepted token imbalance - 1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the whole job")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        if args.ranks % 2:
            parser.error("--ranks must be even (the training layout is DP=N/2 x TP=2)")
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        print(
            torchrun(
                os.path.abspath(__file__),
                nproc=args.ranks,
                args=rest,
                timeout_s=args.timeout,
                env={"OMP_NUM_THREADS": "1", **KEEP_FREED_MEMORY},
            ),
            end="",
        )
        return
    worker(args)


def rollout_shard(args, rank: int, world: int):
    """This rank's prompts (a contiguous block, as a partitioned dataloader gives), n samples each, with
    long-tailed lengths; the lengths of all samples are drawn from one seed so every rank knows the total."""
    rng = np.random.default_rng(args.seed)
    n = args.prompts * args.samples
    lengths = np.clip(rng.lognormal(np.log(512), 1.0, n), args.min_len, args.max_len).astype(np.int64)
    per_rank = args.prompts // world
    prompts = np.arange(rank * per_rank, (rank + 1) * per_rank if rank < world - 1 else args.prompts)
    ids = (prompts[:, None] * args.samples + np.arange(args.samples)).reshape(-1)
    gen = torch.Generator().manual_seed(args.seed + rank)
    tokens = int(lengths[ids].sum())
    batch = PackedBatch(
        ids,
        ids // args.samples,
        lengths[ids],
        {
            "input_ids": torch.randint(0, 151_000, (tokens,), generator=gen),
            "rollout_logprobs": -torch.rand(tokens, generator=gen),
        },
        {"input_ids": lengths[ids], "rollout_logprobs": lengths[ids]},
    )
    return batch, int(lengths.sum())


# --- single-controller baseline ---------------------------------------------------------------------------


def _to_bytes(batch: PackedBatch) -> torch.Tensor:
    """A whole batch as one buffer: [n, ids, groups, lengths, rows] int64, then token ids, then log-probs."""
    n = torch.tensor([len(batch)])
    meta = torch.cat([n, batch.sample_ids, batch.groups, batch.lengths])
    return torch.cat(
        [
            meta.view(torch.uint8),
            batch.fields["input_ids"].view(torch.uint8),
            batch.fields["rollout_logprobs"].view(torch.uint8),
        ]
    )


def _from_bytes(buf: torch.Tensor) -> PackedBatch:
    n = int(buf[:8].view(torch.int64)[0])
    meta = buf[8 : 8 + 24 * n].view(torch.int64)
    ids, groups, lengths = meta[:n], meta[n : 2 * n], meta[2 * n :]
    tokens = int(lengths.sum())
    at = 8 + 24 * n
    input_ids = buf[at : at + 8 * tokens].view(torch.int64)
    logprobs = buf[at + 8 * tokens : at + 12 * tokens].view(torch.float32)
    return PackedBatch(
        ids,
        groups,
        lengths,
        {"input_ids": input_ids, "rollout_logprobs": logprobs},
        {"input_ids": lengths, "rollout_logprobs": lengths},
    )


def driver_shares(bufs: list, consumer: PlacedLayout):
    """Rank 0's own work between its gather and its sends: unpacks and concatenates the N shards, balances
    the groups over the consumer DP ranks, and yields (dp, packed share) per DP rank, each share an index
    select and a torch.cat of the whole batch's rows. (tools/validate_simulator.py times it alone.)"""
    everything = PackedBatch.concat([_from_bytes(b) for b in bufs])
    groups, items = np.unique(everything.groups.numpy(), return_inverse=True)
    weights = np.bincount(items, weights=everything.lengths.numpy()).astype(np.int64)
    dp_of_group = balanced_partition(weights, consumer.layout.dp)
    order = np.argsort(everything.sample_ids.numpy())
    for d in range(consumer.layout.dp):
        share = order[dp_of_group[items[order]] == d]
        yield d, _to_bytes(everything.select(torch.from_numpy(share)))


def single_controller(batch: PackedBatch, consumer: PlacedLayout, stats: dict) -> PackedBatch:
    """Rank 0 gathers every shard, balances groups over consumer DP ranks, and sends each rank its share.
    stats["timeline"]: time.monotonic() stamps of its phases (packed, gathered, split: the shares packed and posted, sent)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = stats.setdefault("timeline", {})
    t["started"] = time.monotonic()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    mine = _to_bytes(batch)
    t["packed"] = time.monotonic()
    size = torch.tensor([mine.numel()])
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)] if rank == 0 else None
    dist.gather(size, sizes, dst=0)
    if rank == 0:
        bufs = [mine] + [torch.empty(int(s), dtype=torch.uint8) for s in sizes[1:]]
        for w in [dist.irecv(bufs[r], r) for r in range(1, world)]:
            w.wait()
        t["gathered"] = time.monotonic()
        stats["received"] += sum(int(s) for s in sizes[1:])
        works, result = [], None
        for d, payload in driver_shares(bufs, consumer):
            for dst in consumer.dp_ranks(d):
                if dst == 0:
                    result = _from_bytes(payload)
                    continue
                works += [dist.isend(torch.tensor([payload.numel()]), dst), dist.isend(payload, dst)]
                stats["sent"] += payload.numel()
        t["split"] = time.monotonic()
        for w in works:
            w.wait()
        t["sent"] = time.monotonic()
        stats["page_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults  # first touches
        return result
    dist.send(mine, 0)
    stats["sent"] += mine.numel()
    size = torch.zeros(1, dtype=torch.long)
    dist.recv(size, 0)
    buf = torch.empty(int(size), dtype=torch.uint8)
    dist.recv(buf, 0)
    t["received"] = time.monotonic()
    stats["received"] += buf.numel()
    return _from_bytes(buf)


# --- measurement ---------------------------------------------------------------------------------------


def measure(run, consumer: PlacedLayout, total_tokens: int):
    """Runs `run(stats)` on every rank between barriers; returns (slowest rank's seconds, per-rank
    [sent, received] bytes, tokens per consumer DP rank)."""
    stats = {"sent": 0, "received": 0}
    dist.barrier()
    start = time.perf_counter()
    out = run(stats)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    traffic = torch.tensor([stats["sent"], stats["received"]], dtype=torch.long)
    every = [torch.zeros_like(traffic) for _ in range(dist.get_world_size())]
    dist.all_gather(every, traffic)
    tokens = torch.zeros(consumer.layout.dp, dtype=torch.long)
    c = consumer.coords(dist.get_rank())
    if c is not None and c.tp == 0:
        tokens[c.dp] = out.num_tokens
    dist.all_reduce(tokens)
    assert int(tokens.sum()) == total_tokens, (
        f"tokens lost or duplicated: {int(tokens.sum())} != {total_tokens}"
    )
    return float(elapsed), torch.stack(every).numpy(), tokens.numpy()


def report(name, walls, traffic, tokens, world, payload):
    """traffic: per-rank [sent, received] bytes. Two views of the busiest rank: its traffic (sent +
    received) over the mean rank's, and its larger direction over an even share of the batch (payload/N)."""
    through = traffic.sum(1)
    busiest = int(np.argmax(through))
    total = int(through.sum())
    share = through[busiest] / (total / world)
    one_way = traffic.max() / (payload / world)
    line = (
        f"{name:<12} wall {statistics.median(walls):.4f} s (runs: {', '.join(f'{w:.3f}' for w in walls)}); "
        f"busiest rank {busiest}: {traffic[busiest, 0] / MiB:.1f} MiB sent + {traffic[busiest, 1] / MiB:.1f} MiB "
        f"received = {through[busiest] / MiB:.1f} MiB of {total / MiB:.1f} MiB total traffic "
        f"(busiest / (total/N) = {share:.2f}; largest one-way bytes / (batch/N) = {one_way:.2f}); "
        f"token imbalance {imbalance(tokens):.4f}"
    )
    return line, share, one_way, imbalance(tokens)


def worker(args):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    placement = Placement.create("colocated", world, 1)
    producer = PlacedLayout.rollout(placement)
    consumer = PlacedLayout.training(ParallelLayout.for_world(world, tp=2), placement)
    batch, total_tokens = rollout_shard(args, rank, world)
    coordinator = DataCoordinator(timeout_s=600)
    edge = DataEdge("train_actor", producer, consumer, FIELDS, keep_groups=True, tolerance=args.tolerance)

    def coordinated(stats):
        handle = coordinator.start(edge, batch)
        out = handle.wait(600)
        stats["sent"], stats["received"] = handle.bytes_sent, handle.bytes_received
        if os.environ.get("BENCH_TIMELINE"):
            t = handle.timeline
            print(
                f"rank {rank} " + " ".join(f"{k}={1000 * (v - t['started']):.0f}ms" for k, v in t.items()),
                flush=True,
            )
        return out

    def baseline(stats):
        out = single_controller(batch, consumer, stats)
        if os.environ.get("BENCH_TIMELINE"):
            t = stats.pop("timeline")
            faults = f" page_faults={stats.pop('page_faults')}" if "page_faults" in stats else ""
            print(
                f"rank {rank} baseline "
                + " ".join(f"{k}={1000 * (v - t['started']):.0f}ms" for k, v in t.items())
                + faults,
                flush=True,
            )
        return out

    results = {"coordinator": [], "baseline": []}
    for round_ in range(args.repeats + 1):
        order = [("coordinator", coordinated), ("baseline", baseline)]
        for name, run in order if round_ % 2 == 0 else order[::-1]:
            measured = measure(run, consumer, total_tokens)
            if round_ > 0:  # round 0 warms up connections and allocators
                results[name].append(measured)
    if rank == 0:
        payload = total_tokens * 12
        print(
            f"{world} ranks: {args.prompts} prompts x {args.samples} samples, lengths {args.min_len}..{args.max_len} "
            f"(mean {total_tokens / (args.prompts * args.samples):.0f}), {total_tokens} tokens, "
            f"{payload / MiB:.1f} MiB of int64 ids + float32 log-probs; rollout DP={world} -> "
            f"train DP={world // 2} x TP=2",
            flush=True,
        )
        summary = {}
        for name, runs in results.items():
            walls = [r[0] for r in runs]
            line, *summary[name] = report(name, walls, runs[-1][1], runs[-1][2], world, payload)
            summary[name].insert(0, statistics.median(walls))
            print(line, flush=True)
        (tc, sc, oc, ic), (tb, sb, ob, ib) = summary["coordinator"], summary["baseline"]
        print(
            f"ratios: baseline/coordinator time = {tb / tc:.2f}x, busiest/(total/N) = {sc:.2f} (baseline {sb:.2f}; "
            f"one-way/(batch/N) {oc:.2f} vs {ob:.2f}), imbalance = {ic:.4f} (baseline {ib:.4f})",
            flush=True,
        )
    coordinator.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
