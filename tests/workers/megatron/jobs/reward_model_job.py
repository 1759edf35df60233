"""Scores a batch with a reward model (MegatronWorker role "reward") at one layout; launched by
tests/workers/megatron/test_reward_model.py:

    torchrun --nproc-per-node N reward_model_job.py --model DIR --batch BATCH.pt --tp T --pp P --out OUT.pt

Every rank scores the whole batch (one data-parallel replica); global rank 0 saves the scores.
"""

import argparse

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    for name in ("--model", "--batch", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    args = parser.parse_args()

    from distflow import distributed
    from distflow.config.schema import ModelConfig, RefConfig
    from distflow.layout import ParallelLayout, Placement
    from distflow.workers.megatron.worker import MegatronWorker

    distributed.init_process_group("cpu", timeout_s=300)
    world = dist.get_world_size()
    layout = ParallelLayout.for_world(world, tp=args.tp, pp=args.pp)
    distributed.initialize_megatron_groups(layout, Placement.create("colocated", world, 1), timeout_s=300)
    distributed.seed_everything(1)  # Megatron's model-parallel RNG tracker must exist before a forward
    worker = MegatronWorker(
        "reward",
        RefConfig(tp=args.tp, pp=args.pp, max_tokens_per_micro_batch=48),
        ModelConfig(path=args.model, dtype="float32"),
        layout,
        "cpu",
    )
    scores = worker.compute_scores(torch.load(args.batch))
    if dist.get_rank() == 0:
        torch.save(scores, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
