"""Benchmarks the weight sync into a real SGLang engine: the WeightResharder against a gather-everything-then-
broadcast baseline and against a plain memory copy of the same bytes (the bound), in one run.

Example: python tools/bench_weight_sync.py --family qwen2 --layers 4 --hidden 512 --tp 2 --pp 1 --engine-tp 1

It writes a random tiny model of that size, launches tp*pp CPU processes over gloo (colocated: they hold the
Megatron shards, built by the HF -> Megatron conversion as a trainer holds them), and starts one engine of
--engine-tp ranks owned by rank 0. Methods, each timed over --repeats rounds after a warm-up (median, from a
barrier to the last rank done):
  resharder: WeightResharder.sync() (every rank writes its own slices into the engine ranks' staging memory,
             or with --transport process_group sends them to the hosting rank over gloo; the owner loads
             them with load_format="direct");
  gather-broadcast: every rank sends its whole shard to rank 0 (gloo), rank 0 rebuilds the full HF tensors
             and hands them to the engine, whose every rank receives the full model and shards it;
  memcpy: one process copying the bytes the engine ranks receive, from memory to memory.
Below the resharder's time, where it went (SyncStats.phases: writing, exchanging, the engine's calls). The
last line has both ratios: gather-broadcast time / resharder time, resharder time / memcpy time.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from distflow import distributed
from distflow.coordination.weights import WeightResharder, engine_side, plan_weight_sync
from distflow.layout import ParallelLayout, Placement
from distflow.models.conversion import (
    HFCheckpoint,
    hf_to_megatron_shard,
    megatron_full_to_hf,
    megatron_shards_to_full,
)
from distflow.models.registry import spec_for
from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import torchrun
from distflow.workers.rollout import shutdown_engine, start_engine, update_weights_from_tensors


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen2", help="a dense family: qwen2, llama, qwen3, mistral")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=0, help="MLP width; 0 = 3 x hidden")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--engine-tp", type=int, default=1)
    parser.add_argument("--bucket-mb", type=float, default=64)
    parser.add_argument(
        "--transport",
        default="auto",
        choices=["auto", "shared_memory", "process_group"],
        help="sync.transport of the resharder: process_group sends every piece another rank "
        "hosts over a gloo group, as between nodes",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    world = args.tp * args.pp
    if world % args.engine_tp:
        parser.error(f"--engine-tp {args.engine_tp} must divide the tp*pp = {world} ranks")
    if "RANK" not in os.environ:
        with tempfile.TemporaryDirectory(prefix="bench-weight-sync-") as tmp:
            model = make_tiny_model(
                args.family,
                os.path.join(tmp, "model"),
                layers=args.layers,
                hidden=args.hidden,
                heads=args.heads,
                kv_heads=args.kv_heads,
                ffn=args.ffn or 3 * args.hidden,
                vocab=args.vocab,
            )
            rest = list(argv if argv is not None else sys.argv[1:]) + ["--model-dir", str(model)]
            out = torchrun(os.path.abspath(__file__), nproc=world, args=rest, timeout_s=args.timeout)
        print("\n".join(line for line in out.splitlines() if line.startswith("BENCH ")).replace("BENCH ", ""))
        return
    worker(args)


def worker(args):
    distributed.init_process_group("cpu", timeout_s=int(args.timeout))
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    engine = None
    if rank == 0:
        engine = start_engine(
            args.model_dir,
            tp=args.engine_tp,
            extra_args=engine_side.engine_args(),
            startup_timeout_s=int(args.timeout),
        )
    dist.barrier()
    checkpoint = HFCheckpoint(args.model_dir)
    spec, cfg = spec_for(checkpoint.config), checkpoint.config
    train = ParallelLayout.for_world(world, tp=args.tp, pp=args.pp)
    # One engine, on the first engine_tp ranks (the other ranks only train).
    placement = Placement(
        kind="colocated",
        world_size=world,
        train_ranks=tuple(range(world)),
        rollout_ranks=tuple(range(args.engine_tp)),
        engine_tp=args.engine_tp,
    )
    local = local_shards(spec, checkpoint, train, rank)
    plan = plan_weight_sync(
        spec, cfg, train, placement, bucket_bytes=int(args.bucket_mb * 2**20), element_size=4
    )
    resharder = WeightResharder(plan, local, engine=engine, transport=args.transport)

    results = {}
    syncs = []  # SyncStats of each round, the warm-up first
    results["resharder"] = timed(lambda: syncs.append(resharder.sync()), args.repeats)
    phases = {p: statistics.median(s.phases[p] for s in syncs[1:]) for p in syncs[-1].phases}
    if rank == 0:
        print(f"resharder done: {results['resharder']:.3f} s", flush=True)
    results["gather-broadcast"] = timed(
        lambda: gather_broadcast(spec, cfg, train, local, engine), args.repeats
    )
    src = torch.randn(plan.total_bytes // 4)
    dst = torch.empty_like(src)
    results["memcpy"] = timed(lambda: dst.copy_(src), args.repeats, collective=False) if rank == 0 else 0.0
    if rank == 0:
        mib = plan.total_bytes / 2**20
        send = plan.sender_bytes()
        print(
            f"BENCH {args.family}: {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; "
            f"train tp={args.tp} pp={args.pp}, engine tp={args.engine_tp}, transport {args.transport}; "
            f"{mib:.1f} MiB into the engine per sync, {len(plan.buckets)} bucket(s) of <= {args.bucket_mb} MiB; "
            f"busiest sender {max(send.values()) / 2**20:.1f} MiB",
            flush=True,
        )
        for name, seconds in results.items():
            rate = plan.total_bytes / seconds / 1e9
            print(f"BENCH {name:>16}: {seconds * 1e3:8.1f} ms  {rate:6.2f} GB/s", flush=True)
            if name == "resharder":
                print(
                    "BENCH   its phases (median; the slowest rank in each): "
                    + ", ".join(f"{p} {t * 1e3:.1f} ms" for p, t in phases.items()),
                    flush=True,
                )
        baseline, resharder, bound = results["gather-broadcast"], results["resharder"], results["memcpy"]
        print(
            f"BENCH ratios: gather-broadcast / resharder = {baseline / resharder:.2f}x, "
            f"resharder / memcpy = {resharder / bound:.2f}x",
            flush=True,
        )

        shutdown_engine(engine)
    dist.barrier()
    dist.destroy_process_group()


def local_shards(spec, checkpoint, train, rank) -> dict[str, torch.Tensor]:
    """This rank's Megatron shards under global names (what megatron_tensors gives for a trained model)."""
    c = train.coords(rank)
    layers = checkpoint.config["num_hidden_layers"] // train.pp
    offset = c.pp * layers
    shard = hf_to_megatron_shard(
        spec,
        checkpoint.config,
        checkpoint.get,
        tp_rank=c.tp,
        tp_size=train.tp,
        layer_offset=offset,
        num_layers=layers,
        pre_process=c.pp == 0,
        post_process=c.pp == train.pp - 1,
    )
    out = {}
    for name, tensor in shard.items():
        if name.startswith("decoder.layers."):
            local, rest = name[len("decoder.layers.") :].split(".", 1)
            name = f"decoder.layers.{offset + int(local)}.{rest}"
        out[name] = tensor.contiguous()
    return out


def gather_broadcast(spec, cfg, train, local, engine) -> None:
    """The baseline: rank 0 gathers every shard (one flat tensor per rank over gloo), rebuilds the full HF
    tensors and gives them to the engine; SGLang sends every engine rank the full model, which shards it."""
    names = sorted(local)
    flat = torch.cat([local[n].reshape(-1) for n in names])
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, (flat.numel(), [(n, tuple(local[n].shape)) for n in names]))
    longest = max(n for n, _ in sizes)
    padded = torch.cat([flat, flat.new_zeros(longest - flat.numel())])
    gathered = [torch.empty(longest) for _ in sizes] if dist.get_rank() == 0 else None
    dist.gather(padded, gathered, dst=0)
    if dist.get_rank() != 0:
        return
    states = []
    for buf, (_, layout) in zip(gathered, sizes):
        state, at = {}, 0
        for name, shape in layout:
            n = torch.Size(shape).numel()
            state[name] = buf[at : at + n].view(shape)
            at += n
        states.append(state)
    hf = {}
    layers = cfg["num_hidden_layers"] // train.pp
    for stage in range(train.pp):
        tp_states = [states[train.rank(tp=t, pp=stage)] for t in range(train.tp)]
        full = megatron_shards_to_full(tp_states, cfg["vocab_size"])
        local_names = {}
        for name, tensor in full.items():  # back to stage-local layer numbers for the HF mapping
            if name.startswith("decoder.layers."):
                g, rest = name[len("decoder.layers.") :].split(".", 1)
                name = f"decoder.layers.{int(g) - stage * layers}.{rest}"
            local_names[name] = tensor
        hf.update(megatron_full_to_hf(spec, cfg, local_names, layer_offset=stage * layers))
    if cfg.get("tie_word_embeddings"):
        hf.pop("lm_head.weight", None)
    update_weights_from_tensors(engine, list(hf.items()))


def timed(fn, repeats: int, collective: bool = True) -> float:
    """Median seconds of fn over repeats, after one warm-up call (staging buffers, the engine's first load);
    collective: every rank runs fn, and a round lasts from a barrier to the last rank done."""
    fn()
    seconds = []
    for _ in range(repeats):
        if collective:
            dist.barrier()
        tic = time.perf_counter()
        fn()
        if collective:
            dist.barrier()
        seconds.append(time.perf_counter() - tic)
    return statistics.median(seconds)


if __name__ == "__main__":
    main()
