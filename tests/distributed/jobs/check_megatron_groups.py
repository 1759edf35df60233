"""torchrun job: builds Megatron's groups from a ParallelLayout and checks them against the layout's maps.

Prints one line per rank: 'GROUPS-OK rank=R' or raises with the first disagreement.
"""

import argparse

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    args = parser.parse_args()

    from megatron.core import parallel_state as ps

    from distflow import distributed
    from distflow.layout import ParallelLayout, Placement

    env = distributed.init_process_group("cpu", timeout_s=120)
    layout = ParallelLayout.for_world(env.world_size, tp=args.tp, pp=args.pp)
    distributed.initialize_megatron_groups(layout, Placement.create("colocated", env.world_size, 1), 120)
    c = layout.coords(env.rank)
    got = (
        ps.get_tensor_model_parallel_rank(),
        ps.get_pipeline_model_parallel_rank(),
        ps.get_data_parallel_rank(),
    )
    assert got == (c.tp, c.pp, c.dp), f"rank {env.rank}: megatron (tp, pp, dp) = {got}, layout says {c}"
    for name, megatron_ranks, ours in (
        ("tp", dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()), layout.tp_group(env.rank)),
        (
            "pp",
            dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
            layout.pp_group(env.rank),
        ),
        ("dp", dist.get_process_group_ranks(ps.get_data_parallel_group()), layout.dp_group(env.rank)),
    ):
        assert sorted(megatron_ranks) == sorted(ours), (
            f"rank {env.rank} {name} group {megatron_ranks} != {ours}"
        )
    print(f"GROUPS-OK rank={env.rank} coords={c}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
