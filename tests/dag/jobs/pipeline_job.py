"""torchrun job: runs a small user pipeline with the per-rank controller over gloo.

--fail-rank R makes node 'explode' raise on rank R; the other ranks are then blocked in the next node's
collective and must be stopped by the failure signal, not by the 300 s collective timeout.
"""

import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist

from distflow.dag import Pipeline
from distflow.dag.controller import RankController
from distflow.dag.failure import FailureSignal


def square(ctx, inputs):
    return {"squares": inputs["prompts"] ** 2}


def explode(ctx, inputs):
    if dist.get_rank() == ctx["fail_rank"]:
        time.sleep(0.5)
        raise ValueError("deliberate failure for the test")
    return {"checked": inputs["squares"]}


def total(ctx, inputs):
    value = inputs["checked"].sum().reshape(1).float()
    dist.all_reduce(value)  # a collective: a rank that skipped it would block here forever
    return {"total": value}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--out")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    failure = FailureSignal.from_default_group(poll_s=0.2).start()
    pipeline = (
        Pipeline("test")
        .add("square", "all", square, ["prompts"], ["squares"])
        .add("explode", "all", explode, ["squares"], ["checked"])
        .add("total", "all", total, ["checked"], ["total"])
    )
    controller = RankController(
        pipeline, {"fail_rank": args.fail_rank}, rank, {"all": tuple(range(world))}, failure=failure
    )
    result = controller.run_step({"prompts": torch.arange(4) + 4 * rank})
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"total": result.outputs["total"].item(), "timing": result.timing_s}, f)
    failure.stop()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
