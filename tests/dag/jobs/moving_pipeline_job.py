"""torchrun job (2 ranks): a pipeline whose data moves from the rollout layout (one engine per rank, each
holding its own samples) to an actor layout of TP=2 (both ranks need every sample), through the
controller's CoordinatorMover. Rank 0 writes what the consumer node saw, for the test to check."""

import argparse
import datetime
import json

import torch
import torch.distributed as dist

from distflow.config import resolve
from distflow.coordination.data import DataCoordinator, PackedBatch
from distflow.dag import Pipeline
from distflow.dag.controller import RankController
from distflow.dag.data_mover import CoordinatorMover
from distflow.dag.roles import ranks_of_role
from distflow.layout import ClusterLayout

SAMPLES_PER_RANK, GROUP = 6, 3


def make_samples(rank: int) -> PackedBatch:
    gen = torch.Generator().manual_seed(rank)
    ids = [rank * 100 + i for i in range(SAMPLES_PER_RANK)]
    tokens = [
        torch.randint(0, 50, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen) for _ in ids
    ]
    return PackedBatch.from_samples(ids, [i // GROUP for i in ids], {"input_ids": tokens})


def generate(ctx, inputs):
    return {"samples": make_samples(dist.get_rank())}


def advantage(ctx, inputs):
    """Per-sample token sum minus its group's mean: needs whole groups, runs where the samples are."""
    s = inputs["samples"]
    sums = torch.tensor([float(s.sample(i)["input_ids"].sum()) for i in range(len(s))])
    adv = sums.clone()
    for g in s.groups.unique():
        members = s.groups == g
        adv[members] -= sums[members].mean()
    return {"advantages": PackedBatch(s.sample_ids, s.groups, s.lengths, {"advantages": adv})}


def train(ctx, inputs):
    s, a = inputs["samples"], inputs["advantages"]
    return {
        "seen": {
            "ids": s.sample_ids.tolist(),
            "adv_ids": a.sample_ids.tolist(),
            "tokens": [s.sample(i)["input_ids"].tolist() for i in range(len(s))],
            "adv": a.fields["advantages"].tolist(),
        }
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    cfg = resolve(None, ["actor.tp=2"])
    cluster = ClusterLayout.from_config(cfg, dist.get_world_size(), None)
    pipeline = Pipeline(
        "moving", fields={"samples": {"input_ids": "all"}, "advantages": {"advantages": "last"}}
    )
    pipeline.add("generate", "rollout", generate, ["prompts"], ["samples"])
    pipeline.add("advantage", "all", advantage, ["samples"], ["advantages"], keep_groups=True)
    pipeline.add("train", "actor", train, ["samples", "advantages"], ["seen"])
    coordinator = DataCoordinator(timeout_s=60)
    mover = CoordinatorMover(pipeline, cluster, coordinator)
    controller = RankController(pipeline, {}, dist.get_rank(), ranks_of_role(cluster), mover=mover)
    seen = controller.run_step({"prompts": None}).outputs["seen"]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, seen)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "per_rank": gathered,
                    "node_layouts": {k: v.describe() for k, v in mover.node_layouts.items()},
                },
                f,
            )
    coordinator.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
