"""Times Megatron's passes on this machine for a config's actor (its model, TP/PP layout, micro-batching), as
the calibration's "Megatron forward/backward of the configured model": one torchrun job of tp x pp CPU
ranks (DP 1), synthetic rows of the configured prompt + response length, at two batch sizes so that a
fixed cost per pass and a cost per token come apart.

    python -m distflow.plan.simulate.megatron_probe CONFIG [key=value ...] --rows R --seq S --out OUT.json
(run by calibrate.py under torchrun; rank 0 writes OUT.json)
"""

import argparse
import json

import torch

from distflow import distributed
from distflow.config import resolve
from distflow.config.__main__ import split_config_args
from distflow.layout import ParallelLayout, Placement
from distflow.plan.simulate.best_time import interleaved_median_seconds
from distflow.workers.megatron.worker import MegatronWorker


def synthetic_batch(rows: int, seq: int, vocab: int) -> dict:
    """Rows of `seq` tokens, the second half of each a response."""
    gen = torch.Generator().manual_seed(0)
    response = torch.zeros(rows, seq)
    response[:, seq // 2 :] = 1.0
    return {
        "input_ids": torch.randint(0, vocab, (rows, seq), generator=gen),
        "attention_mask": torch.ones(rows, seq, dtype=torch.long),
        "response_mask": response,
        "old_logprobs": torch.zeros(rows, seq),
        "rollout_logprobs": torch.zeros(rows, seq),
        "advantages": torch.randn(rows, seq, generator=gen),
    }


def policy_gradient_loss(logprobs, entropy, mb):
    mask = mb["response_mask"]
    loss = -(logprobs * mb["advantages"] * mask).sum() / mask.sum().clamp(min=1)
    return loss, {}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--out", required=True)
    ns = parser.parse_intermixed_args(argv)
    path, overrides = split_config_args(ns.args)
    cfg = resolve(path, overrides)
    env = distributed.init_process_group("cpu", timeout_s=600)
    torch.set_num_threads(1)
    world = torch.distributed.get_world_size()
    layout = ParallelLayout.for_world(world, tp=cfg.actor.tp, pp=cfg.actor.pp)
    distributed.initialize_megatron_groups(layout, Placement.create("colocated", world, 1), timeout_s=600)
    distributed.seed_everything(1)  # Megatron's model-parallel RNG states, as the trainer sets them
    worker = MegatronWorker("actor", cfg.actor, cfg.model, layout, "cpu", total_optimizer_steps=100)
    vocab = json.load(open(f"{cfg.model.path}/config.json"))["vocab_size"]
    batches = {rows: synthetic_batch(rows, ns.seq, vocab) for rows in (ns.rows, max(1, ns.rows // 2))}
    # The calibration fits a fixed cost and one per token through the two sizes: their passes are timed in
    # turn, so that a slow spell of the machine does not land on one size alone (and in the slope).
    calls = {}
    for rows, batch in batches.items():
        calls[rows, "forward_s"] = lambda batch=batch: worker.compute_logprobs(batch)
        calls[rows, "train_s"] = lambda batch=batch: worker.train_step(batch, policy_gradient_loss)
    seconds = interleaved_median_seconds(calls)
    result = {
        rows: {
            "forward_s": seconds[rows, "forward_s"],
            "train_s": seconds[rows, "train_s"],
            "tokens": rows * ns.seq,
        }
        for rows in batches
    }
    if env.rank == 0:
        with open(ns.out, "w") as f:
            json.dump(result, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
