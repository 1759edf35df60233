"""2 gloo ranks with unequal per-rank metrics reduce them with reduce_over_ranks; rank 0 writes the result."""

import argparse
import json

import torch.distributed as dist

from distflow.tracking.reduce import reduce_over_ranks

# What each rank records in a step: rank 0 scored 3 samples, rank 1 one; only rank 0 has a DAPO counter.
PER_RANK = [
    {
        "reward/mean": 0.2,
        "reward/max": 0.5,
        "reward/min": 0.0,
        "reward/samples": 3,
        "reward/errors": 1,
        "rollout/tokens": 120,
        "rollout/samples": 3,
        "rollout/response_length/mean": 10.0,
        "rollout/response_length/max": 14,
        "rollout/response_length/min": 6,
        "rollout/weight_version": 4,
        "actor/pg_loss": 0.25,
        "dapo/attempts": 2,
    },
    {
        "reward/mean": 1.0,
        "reward/max": 1.0,
        "reward/min": 1.0,
        "reward/samples": 1,
        "reward/errors": 0,
        "rollout/tokens": 40,
        "rollout/samples": 1,
        "rollout/response_length/mean": 30.0,
        "rollout/response_length/max": 30,
        "rollout/response_length/min": 30,
        "rollout/weight_version": 3,
        "actor/pg_loss": 0.25,
    },
]

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reduced = reduce_over_ranks(PER_RANK[rank])
    everywhere = [None] * dist.get_world_size()
    dist.all_gather_object(everywhere, reduced)
    assert everywhere[0] == everywhere[1], everywhere  # every rank gets the same reduction
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(reduced, f)
    dist.destroy_process_group()
