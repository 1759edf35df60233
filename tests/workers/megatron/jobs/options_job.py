"""Runs MegatronWorker with memory options on one CPU rank; launched from test_megatron_options.py.

    torchrun --nproc-per-node 1 options_job.py --inputs INPUTS.pt --out RESULT.pt
Writes {"ref_logprobs", "ref_offload_logprobs", "ref_offload_active", "weights" {variant: HF state after one
step}, "decoupled" {variant: Megatron's optimizer config value}, "errors" {case: error message}}.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_job import make_worker  # noqa: E402
from worker_reference import pg_loss  # noqa: E402

LAYOUT = dict(tp=1, pp=1, vpp=1, ep=1, sp=0, rc=0)


def error_of(build) -> str:
    try:
        build()
    except ValueError as error:
        return str(error)
    return "no error"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from distflow import distributed

    distributed.init_process_group("cpu", timeout_s=300)
    torch.set_num_threads(1)
    inputs = torch.load(args.inputs)
    model_dir, batch = inputs["model"], inputs["batch"]
    out = {"weights": {}, "decoupled": {}, "errors": {}}

    ref, _ = make_worker("ref", model_dir, LAYOUT)
    out["ref_logprobs"] = ref.compute_logprobs(batch)[0]
    ref_offload, _ = make_worker("ref", model_dir, LAYOUT, offload=True)
    out["ref_offload_logprobs"] = ref_offload.compute_logprobs(batch)[0]
    out["ref_offload_active"] = ref_offload.offloader.active

    # Megatron OptimizerConfig passthrough: Adam with L2 weight decay instead of AdamW (its default).
    for variant, extra in (("default", {}), ("adam_l2", {"decoupled_weight_decay": False})):
        actor, _ = make_worker("actor", model_dir, LAYOUT, optim=dict(weight_decay=0.5, megatron=extra))
        actor.train_step(batch, pg_loss)
        out["weights"][variant] = actor.export_hf_state()
        out["decoupled"][variant] = actor.optimizer.config.decoupled_weight_decay

    out["errors"]["actor_offload"] = error_of(lambda: make_worker("actor", model_dir, LAYOUT, offload=True))
    out["errors"]["critic_offload"] = error_of(lambda: make_worker("critic", model_dir, LAYOUT, offload=True))
    out["errors"]["optimizer_cpu_offload"] = error_of(
        lambda: make_worker("actor", model_dir, LAYOUT, optim=dict(megatron={"optimizer_cpu_offload": True}))
    )
    torch.save(out, args.out)


if __name__ == "__main__":
    main()
