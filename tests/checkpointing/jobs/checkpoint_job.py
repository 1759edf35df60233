"""Checkpoint save/restore and NaN-step cases on real MegatronWorkers; launched by tests/checkpointing.

    torchrun --nproc-per-node N checkpoint_job.py --model DIR --dir RUN_DIR CASE [key=value ...]

The world is one actor layout (tp=, dp= from the world size). Training batches are drawn from a seeded
generator, one per step, each rank taking its data-parallel share. Cases:
  straight  trains steps 1..4 with a checkpoint at step 2; writes the metrics and weights of steps 3..4
  resumed   a fresh worker resumes (checkpoint.resume=auto) from RUN_DIR and trains steps 3..4; writes the same
  crash     saves step 1, trains step 2, then its disk fills up (a file size limit) while it saves step 2
  after_crash  resumes from RUN_DIR; writes the restored step and the weights (those saved at step 1)
  nan       steps whose loss is NaN are skipped; max_consecutive_bad_steps in a row raise
  export    trains steps 1..2, checkpoints step 2, and exports the actor as the trainer's final export does
            (export_hf_state + save_hf_checkpoint into RUN_DIR/hf)
  load      after `export`: an actor with actor.load=RUN_DIR/checkpoints/step_2 (its weights), a critic with
            critic.load=RUN_DIR/checkpoints/step_2/actor (a fresh value head), and actor.load with
            model.path=--other-model (refused: another shape)
Rank 0 writes RUN_DIR/<case>.pt.
"""

import argparse
import dataclasses
import os
import random
import resource
import signal
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

VOCAB = 300


def make_worker(model_dir, tp: int, mini_batch_size: int = 4, dist_opt: bool = False, load=None):
    from distflow import distributed
    from distflow.config.schema import ActorConfig, ModelConfig, OptimizerConfig
    from distflow.layout import ParallelLayout, Placement
    from distflow.workers.megatron.worker import MegatronWorker

    world = dist.get_world_size()
    par = ParallelLayout.for_world(world, tp=tp)
    distributed.initialize_megatron_groups(par, Placement.create("colocated", world, 1), timeout_s=300)
    distributed.seed_everything(1)
    optim = OptimizerConfig(
        lr=1e-2,
        weight_decay=0.01,
        clip_grad=1.0,
        use_distributed_optimizer=dist_opt,
        lr_warmup_steps=3,
        lr_decay_style="cosine",
    )
    cfg = ActorConfig(
        tp=tp, optim=optim, mini_batch_size=mini_batch_size, max_tokens_per_micro_batch=40, load=load
    )
    return MegatronWorker(
        "actor", cfg, ModelConfig(path=model_dir, dtype="float32"), par, "cpu", total_optimizer_steps=20
    ), par


def batch_for(step: int, par) -> dict:
    """Step `step`'s batch (8 rows, the same on every rank), this rank's DP share of it. Uses torch's global
    generator for the advantages on purpose: a resumed run only matches if the RNG state was restored."""
    from megatron.core import parallel_state as ps

    gen = torch.Generator().manual_seed(step)
    rows, seq = 8, 12
    input_ids = torch.randint(1, VOCAB, (rows, seq), generator=gen)
    response_mask = torch.zeros(rows, seq)
    response_mask[:, 4:] = 1.0
    advantages = torch.randn(rows, seq)  # global generator: same draw on every rank (same seed, same calls)
    batch = {
        "input_ids": input_ids,
        "attention_mask": torch.ones(rows, seq, dtype=torch.long),
        "response_mask": response_mask,
        "advantages": advantages * (1 + random.random()),
    }
    per = rows // par.dp
    start = ps.get_data_parallel_rank() * per
    return {k: v[start : start + per] for k, v in batch.items()}


def pg_loss(logprobs, entropy, mb):
    mask = mb["response_mask"]
    loss = -(logprobs * mb["advantages"] * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"pg_loss": loss.detach()}


def nan_loss(logprobs, entropy, mb):
    loss, metrics = pg_loss(logprobs, entropy, mb)
    return loss * float("nan"), metrics


def nan_grad_loss(logprobs, entropy, mb):
    """A finite loss with NaN gradients: sqrt'(0) is inf, and the chain rule multiplies it by 0."""
    loss, metrics = pg_loss(logprobs, entropy, mb)
    return loss + torch.sqrt((logprobs * 0).sum()), metrics


class StepLoader:
    """A stand-in prompt loader: its state is the next step, so a resumed run must restore it."""

    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def checkpointer(run_dir, resume="auto", save_every=2):
    from distflow.checkpointing import Checkpointer

    cfg = SimpleNamespace(save_every=save_every, keep_last=2, resume=resume, checksums=True)
    return Checkpointer(cfg, run_dir, dist.get_rank(), dist.get_world_size())


def train(worker, par, loader, steps, loss_fn=pg_loss):
    out = []
    for step in steps:
        loader.position = step
        out.append(worker.train_step(batch_for(step, par), loss_fn))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--dist-opt", action="store_true", help="the distributed optimizer (ZeRO-1 over DP)")
    parser.add_argument("--other-model", help="load: a model of another shape than --model")
    parser.add_argument("case")
    args = parser.parse_args()

    from distflow import distributed

    distributed.init_process_group("cpu", timeout_s=300)
    torch.set_num_threads(1)
    # nan: one optimizer step per train_step (the whole batch), so that steps and optimizer steps coincide
    step_2 = os.path.join(args.dir, "checkpoints", "step_2")
    worker, par = make_worker(
        args.model,
        args.tp,
        mini_batch_size=8 if args.case == "nan" else 4,
        dist_opt=args.dist_opt,
        load=step_2 if args.case == "load" else None,
    )
    from megatron.core import parallel_state as ps

    random.seed(ps.get_data_parallel_rank())  # each DP rank's python RNG differs (restored per rank)
    loader = StepLoader()
    result = {}
    if args.case == "straight":
        ckpt = checkpointer(args.dir)
        for step in (1, 2):
            train(worker, par, loader, [step])
            if ckpt.should_save(step, 4):
                ckpt.save(step, {"actor": worker}, loader, run_id="run0")
        result = {"metrics": train(worker, par, loader, [3, 4]), "weights": worker.export_hf_state()}
    elif args.case == "resumed":
        ckpt = checkpointer(args.dir)
        start = ckpt.restore({"actor": worker}, loader)
        result = {
            "start": start,
            "loader": loader.position,
            "tracker": ckpt.tracker_resume(),
            "metrics": train(worker, par, loader, [3, 4]),
            "weights": worker.export_hf_state(),
        }
    elif args.case == "crash":
        ckpt = checkpointer(args.dir, save_every=1)
        train(worker, par, loader, [1])
        ckpt.save(1, {"actor": worker}, loader, run_id="run0")
        weights = worker.export_hf_state()
        if dist.get_rank() == 0:
            torch.save(weights, os.path.join(args.dir, "weights_step1.pt"))
        train(worker, par, loader, [2])
        # The disk fills up half-way through step 2's save: past 64 KiB, every file write fails (EFBIG, as
        # ENOSPC would) in this process and the writer processes it forks. Step 2's small rank files and
        # metadata could be written; its model and optimizer shards cannot.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        ckpt.save(2, {"actor": worker}, loader, run_id="run0")
    elif args.case == "after_crash":
        ckpt = checkpointer(args.dir)
        result = {"start": ckpt.restore({"actor": worker}, loader), "weights": worker.export_hf_state()}
    elif args.case == "nan":
        from distflow.workers.megatron.worker import NonFiniteLossError

        worker.max_consecutive_bad_steps = 3
        before = worker.export_hf_state()
        bad = train(worker, par, loader, [1, 2], loss_fn=nan_loss)  # 2 bad steps: skipped, no error yet
        after_bad = worker.export_hf_state()
        good = train(worker, par, loader, [3])  # resets the count
        after_good = worker.export_hf_state()
        bad_again = train(worker, par, loader, [4, 5], loss_fn=nan_grad_loss)  # finite loss, NaN gradients
        after_bad_again = worker.export_hf_state()
        try:
            train(worker, par, loader, [6], loss_fn=nan_loss)  # the third in a row
            error = None
        except NonFiniteLossError as err:
            error = str(err)
        result = {
            "before": before,
            "after_bad": after_bad,
            "bad": bad,
            "good": good,
            "bad_again": bad_again,
            "after_good": after_good,
            "after_bad_again": after_bad_again,
            "error": error,
        }
    elif args.case == "export":
        from distflow.workers.megatron.hf_io import save_hf_checkpoint

        ckpt = checkpointer(args.dir)
        for step in (1, 2):
            train(worker, par, loader, [step])
        ckpt.save(2, {"actor": worker}, loader, run_id="run0")
        state = worker.export_hf_state()
        if dist.get_rank() == 0:  # what the trainer does after its last step (checkpoint.export_hf)
            save_hf_checkpoint(state, args.model, os.path.join(args.dir, "hf"))
        result = {"weights": state}
    elif args.case == "load":
        from distflow.config.schema import CriticConfig, ModelConfig
        from distflow.workers.megatron.worker import MegatronWorker

        result = {"weights": worker.export_hf_state(), "loaded_from": str(worker.loaded_from)}
        critic = MegatronWorker(
            "critic",
            CriticConfig(tp=args.tp, load=os.path.join(step_2, "actor")),
            ModelConfig(path=args.model, dtype="float32"),
            par,
            "cpu",
        )
        result["critic_weights"] = critic.export_hf_state()
        unrecorded = os.path.join(args.dir, "unrecorded_actor")  # as an older DistFlow wrote it: shapes only
        if dist.get_rank() == 0:
            import shutil

            from distflow.models.checkpoint_import import SOURCE_FILE

            shutil.copytree(os.path.join(step_2, "actor"), unrecorded, dirs_exist_ok=True)
            os.remove(os.path.join(unrecorded, SOURCE_FILE))
        dist.barrier()
        for name, load in (("mismatch", step_2), ("shape_mismatch", unrecorded)):
            cfg = dataclasses.replace(worker.cfg, load=load)
            try:
                MegatronWorker("actor", cfg, ModelConfig(path=args.other_model, dtype="float32"), par, "cpu")
                result[name] = None
            except ValueError as error:
                result[name] = str(error)
    else:
        sys.exit(f"unknown case {args.case}")
    if dist.get_rank() == 0:
        torch.save(result, os.path.join(args.dir, f"{args.case}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
