"""Runs MegatronWorker cases in several layouts of one torchrun job; launched from tests/workers/megatron.

    torchrun --nproc-per-node N worker_job.py --inputs INPUTS.pt --out DIR CASE [CASE ...]

INPUTS.pt (written by the test) holds the model directories and a batch per model. A CASE is
`kind:model:key=value,...`, e.g. `actor:m2:tp=2,pp=1`; the keys are tp, pp, vpp, ep, sp (0/1: sequence
parallel), rc (0/1: full recomputation) and dp (checked: the world size decides it). For every case the
world is re-divided into that layout (Megatron's groups are rebuilt). Kinds:
  actor    log-probs and entropy of the batch, then one train_step of `pg_loss` over the whole batch:
           writes logprobs, entropy, metrics and the HF-named gradients;
  dynamic  two optimizer steps (mini-batches of half the batch) per micro-batch split variant: writes
           metrics and the updated HF-named weights per variant;
  critic   values of the batch, then train_steps on an MSE loss under LR warm-up: writes values, losses
           and the learning rates.
Rank 0 writes DIR/<case index>.pt. Each data-parallel rank gets a contiguous share of the rows.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_reference import mse_loss, pg_loss  # noqa: E402  (shared with the test, which checks HF's side)

DYNAMIC_VARIANTS = [  # (use_dynamic_batch, micro_batch_size, max_tokens_per_micro_batch)
    (False, 1, 0),
    (False, 3, 0),
    (True, 0, 24),
    (True, 0, 64),
    (True, 0, 100000),
]
# Adam's first steps move a weight by ~lr * g / (|g| + eps): where |g| is ~1e-9 (a few of thousands), float
# noise of the summation order flips the update. A larger eps makes such updates linear in g.
DYNAMIC_ADAM_EPS = 1e-5
CRITIC_STEPS = 4
CRITIC_OPTIM = dict(lr=3e-3, lr_warmup_steps=CRITIC_STEPS)  # the lrs it reports show the warm-up


def parse_case(text: str) -> tuple[str, str, dict]:
    kind, model, opts = text.split(":")
    layout = dict(tp=1, pp=1, vpp=1, ep=1, sp=0, rc=0)
    layout.update({k: int(v) for k, v in (kv.split("=") for kv in opts.split(",") if kv)})
    return kind, model, layout


def make_worker(role, model_dir, layout, optim=None, **role_fields):
    from distflow import distributed
    from distflow.config.schema import ActorConfig, CriticConfig, ModelConfig, OptimizerConfig
    from distflow.layout import ParallelLayout, Placement
    from distflow.workers.megatron.worker import MegatronWorker

    world = dist.get_world_size()
    par = ParallelLayout.for_world(
        world, tp=layout["tp"], pp=layout["pp"], vpp=layout["vpp"], ep=layout["ep"]
    )
    assert par.dp == layout.get("dp", par.dp), f"{layout}: the world gives dp={par.dp}"
    distributed.initialize_megatron_groups(par, Placement.create("colocated", world, 1), timeout_s=300)
    distributed.seed_everything(1)
    optim = OptimizerConfig(
        **{**dict(lr=1e-3, weight_decay=0.0, clip_grad=1.0, use_distributed_optimizer=False), **(optim or {})}
    )
    cls = CriticConfig if role == "critic" else ActorConfig
    fields = dict(
        tp=layout["tp"],
        pp=layout["pp"],
        vpp=layout["vpp"],
        ep=layout["ep"],
        sequence_parallel=bool(layout["sp"]),
        optim=optim,
        max_tokens_per_micro_batch=64,
    )
    if layout["rc"]:  # full activation recomputation of every layer
        fields.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    fields.update(role_fields)
    return MegatronWorker(
        role,
        cls(**fields),
        ModelConfig(path=model_dir, dtype="float32"),
        par,
        "cpu",
        total_optimizer_steps=10,
    ), par


def dp_share(batch: dict, par) -> tuple[dict, range]:
    from megatron.core import parallel_state as ps

    rows = batch["input_ids"].shape[0]
    per = rows // par.dp
    share = range(ps.get_data_parallel_rank() * per, (ps.get_data_parallel_rank() + 1) * per)
    return {k: v[share.start : share.stop] for k, v in batch.items()}, share


def gather_rows(tensors: dict, share: range, rows: int) -> dict | None:
    """Rank 0 gets every DP share put back in batch order."""
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object((share, tensors), parts, dst=0)
    if dist.get_rank() != 0:
        return None
    out = {k: torch.zeros(rows, *v.shape[1:], dtype=v.dtype) for k, v in tensors.items()}
    for rng, part in parts:
        for k, v in part.items():
            out[k][rng.start : rng.stop] = v
    return out


def run_actor(model_dir, layout, batch):
    # No effective clipping: the gathered gradients are the raw ones, comparable with HF's.
    worker, par = make_worker("actor", model_dir, layout, optim=dict(clip_grad=1e6))
    mine, share = dp_share(batch, par)
    logprobs, entropy = worker.compute_logprobs(mine)
    metrics = worker.train_step(mine, pg_loss)
    grads = worker.gather_hf_grads()
    result = gather_rows({"logprobs": logprobs, "entropy": entropy}, share, batch["input_ids"].shape[0])
    return result and {**result, "metrics": metrics, "grads": grads}


def run_dynamic(model_dir, layout, batch):
    results = []
    for use_dynamic, micro_batch_size, max_tokens in DYNAMIC_VARIANTS:
        worker, par = make_worker(
            "actor",
            model_dir,
            layout,
            optim=dict(adam_eps=DYNAMIC_ADAM_EPS),
            use_dynamic_batch=use_dynamic,
            micro_batch_size=micro_batch_size or 1,
            max_tokens_per_micro_batch=max_tokens,
            mini_batch_size=batch["input_ids"].shape[0] // 2,
        )
        mine, _ = dp_share(batch, par)
        metrics = worker.train_step(mine, pg_loss)
        results.append(
            {
                "variant": (use_dynamic, micro_batch_size, max_tokens),
                "metrics": metrics,
                "weights": worker.export_hf_state(),
            }
        )
    return results if dist.get_rank() == 0 else None


def run_critic(model_dir, layout, batch):
    worker, par = make_worker("critic", model_dir, layout, optim=CRITIC_OPTIM)
    mine, share = dp_share(batch, par)
    values = worker.compute_values(mine)
    steps = [worker.train_step(mine, mse_loss) for _ in range(CRITIC_STEPS)]
    result = gather_rows({"values": values}, share, batch["input_ids"].shape[0])
    return result and {**result, "losses": [m["loss"] for m in steps], "lrs": [m["lr"] for m in steps]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("cases", nargs="+")
    args = parser.parse_args()

    from distflow import distributed

    distributed.init_process_group("cpu", timeout_s=300)
    torch.set_num_threads(1)
    inputs = torch.load(args.inputs)
    runners = {"actor": run_actor, "dynamic": run_dynamic, "critic": run_critic}
    for index, case in enumerate(args.cases):
        kind, model, layout = parse_case(case)
        result = runners[kind](inputs["models"][model], layout, inputs["batches"][model])
        if dist.get_rank() == 0:
            torch.save({"case": case, "result": result}, os.path.join(args.out, f"{index}.pt"))
            print(f"done {case}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
