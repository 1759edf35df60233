"""2 ranks (gloo, Megatron groups tp=1 dp=2): each holds half of a batch; the advantage nodes' whitening
over both ranks must give what one process gives on the whole batch. Exits non-zero on a mismatch."""

import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/..")
from test_advantage_nodes import _ctx, _rewards, _samples  # noqa: E402

from distflow import distributed  # noqa: E402
from distflow.batch import from_padded, to_padded  # noqa: E402
from distflow.coordination.data import PackedBatch  # noqa: E402
from distflow.layout import ParallelLayout, Placement  # noqa: E402
from distflow.nodes import advantage  # noqa: E402
from distflow.tracking.reduce import reduce_metrics  # noqa: E402

REWARDS = [1.0, 0.0, 0.5, 0.25]


def main():
    env = distributed.init_process_group("cpu", 120)
    distributed.initialize_megatron_groups(
        ParallelLayout.for_world(2, tp=1), Placement.create("colocated", 2, 1, 0), 120
    )
    samples = _samples()
    rewards = _rewards(samples, REWARDS)
    values = torch.randn(to_padded(samples)["input_ids"].shape, generator=torch.Generator().manual_seed(3))
    values = from_padded(samples, {"values": values})
    # Rank r holds samples 2r and 2r + 1 (positions in the batch as built).
    mine = [2 * env.rank, 2 * env.rank + 1]
    local = samples.select(mine)
    by_id = {int(i): k for k, i in enumerate(values.sample_ids)}
    local_values = values.select([by_id[int(samples.sample_ids[k])] for k in mine])
    gae_ctx = _ctx(adv_estimator="gae", gamma=0.9, lam=0.8)
    split = advantage.gae(
        gae_ctx,
        {"samples": local, "rewards": rewards.select(mine), "values": local_values, "old_logprobs": None},
    )["advantages"]
    outcome_ctx = _ctx(adv_estimator="reinforce_pp_baseline")
    outcome = advantage.compute(outcome_ctx, {"samples": local, "rewards": rewards.select(mine)})[
        "advantages"
    ]
    gathered = [None, None]
    dist.all_gather_object(gathered, (split, outcome))

    # The same nodes on one "rank" holding everything: no collective (a process group of its own).
    whole_gae_ctx = _ctx(adv_estimator="gae", gamma=0.9, lam=0.8)
    whole_out_ctx = _ctx(adv_estimator="reinforce_pp_baseline")
    whole_gae = _single(
        lambda: advantage.gae(
            whole_gae_ctx, {"samples": samples, "rewards": rewards, "values": values, "old_logprobs": None}
        )["advantages"]
    )
    whole_out = _single(
        lambda: advantage.compute(whole_out_ctx, {"samples": samples, "rewards": rewards})["advantages"]
    )
    # The step metrics of the two ranks, reduced as the trainer does, are the single process's.
    for ctx, whole_ctx in ((gae_ctx, whole_gae_ctx), (outcome_ctx, whole_out_ctx)):
        per_rank = [None, None]
        dist.all_gather_object(per_rank, ctx.step.metrics)
        reduced = reduce_metrics(per_rank)
        for name in (
            "advantage/mean",
            "advantage/max",
            "advantage/min",
            "reward/shaped/mean",
            "reward/shaped/max",
            "reward/shaped/min",
        ):
            torch.testing.assert_close(reduced[name], whole_ctx.step.metrics[name], msg=name)
    joined_gae = PackedBatch.concat([g[0] for g in gathered]).sorted_by_id()
    joined_out = PackedBatch.concat([g[1] for g in gathered]).sorted_by_id()
    torch.testing.assert_close(to_padded(joined_gae)["advantages"], to_padded(whole_gae)["advantages"])
    torch.testing.assert_close(joined_out.fields["advantages"], whole_out.sorted_by_id().fields["advantages"])
    if env.rank == 0:
        print("WHITEN OK", flush=True)
    dist.destroy_process_group()


def _single(fn):
    """Runs fn as if no process group existed (the node then whitens over its own batch)."""
    real = advantage.dist.is_initialized
    advantage.dist.is_initialized = lambda: False
    try:
        return fn()
    finally:
        advantage.dist.is_initialized = real


if __name__ == "__main__":
    main()
