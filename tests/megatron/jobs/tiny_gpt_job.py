"""Trains a tiny Megatron-Core GPT (dense or MoE) on CPU over gloo; launched by torchrun from tests/megatron.

Everything that matters runs through Megatron's own code: parallel_state, GPTModel with the local layer
spec, Megatron DDP, get_megatron_optimizer, the get_forward_backward_func schedule (2 micro-batches) and
dist_checkpointing. The rank holding the last pipeline stage (TP rank 0, DP rank 0) writes --out as JSON:
    {"losses": [per-step loss averaged over micro-batches and DP], "eval_loss": float | null, "layout": {...}}

Layouts are compared through a shared starting point: one run saves its initial weights with --save-init,
the others start from them with --load-init (fresh init differs per layout, e.g. each PP stage draws its
own weights).
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

import megatron_patches

SEQ_LEN = 32
VOCAB = 128
MICRO_BATCH = 2
NUM_MICRO_BATCHES = 2
SEED = 1234  # model init and the training batch
EVAL_SEED = 4321  # the fixed batch --eval scores


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallel (needs --tp > 1)")
    p.add_argument(
        "--dist-opt", action="store_true", help="Megatron's distributed optimizer (shards over DP)"
    )
    p.add_argument("--moe", action="store_true", help="4 experts, top-2, alltoall dispatcher")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--save-init", help="dist-checkpoint dir for the weights before training")
    p.add_argument("--load-init", help="dist-checkpoint dir to start from")
    p.add_argument("--save-ckpt", help="dist-checkpoint dir for the weights after training")
    p.add_argument("--load-ckpt", help="dist-checkpoint dir to load after training (before --eval)")
    p.add_argument("--eval", action="store_true", help="forward-only loss on a fixed batch after training")
    p.add_argument("--out", required=True)
    return p.parse_args()


def build_model(args):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    # No linear biases in the MoE model, as in Megatron's MoE recipes: SequentialMLP experts with biases add
    # them in place into a view returned by a custom autograd Function, which autograd forbids.
    moe = (
        dict(
            num_moe_experts=4,
            moe_router_topk=2,
            moe_token_dispatcher_type="alltoall",
            expert_model_parallel_size=args.ep,
            moe_ffn_hidden_size=128,
            add_bias_linear=False,
        )
        if args.moe
        else {}
    )
    config = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=256,
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        sequence_parallel=args.sp,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        **moe,
    )
    spec = get_gpt_layer_local_spec(num_experts=4 if args.moe else None)
    # Tied embeddings, as in the small models DistFlow trains: with PP the last stage keeps a copy of the
    # embedding that Megatron syncs at set-up and whose grads it all-reduces with the first stage's.
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ_LEN,
        share_embeddings_and_output_weights=True,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )
    return model, config


def save_checkpoint(model, directory):
    from megatron.core import dist_checkpointing

    os.makedirs(directory, exist_ok=True)
    dist_checkpointing.save(model.sharded_state_dict(), directory)


def load_checkpoint(model, directory):
    from megatron.core import dist_checkpointing

    state = dist_checkpointing.load(model.sharded_state_dict(), directory)
    model.load_state_dict(state)


def make_batches(seed: int, count: int):
    """Micro-batches of the global batch, identical on every rank; each DP rank later takes its own rows."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (count, MICRO_BATCH, SEQ_LEN + 1), generator=gen)
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]


def data_parallel_rows(tokens: torch.Tensor):
    """This DP rank's share of a micro-batch (EP runs use DP ranks; the 1-rank reference sees all rows)."""
    from megatron.core import parallel_state

    dp_size = parallel_state.get_data_parallel_world_size()
    dp_rank = parallel_state.get_data_parallel_rank()
    return tokens.chunk(dp_size, dim=0)[dp_rank]


def run_schedule(model, config, batches, forward_only: bool):
    """One call of Megatron's schedule over the micro-batches; returns their mean loss (last stage) or None."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    position_ids = torch.arange(SEQ_LEN).unsqueeze(0)
    iterator = iter(batches)

    def forward_step(_data_iterator, chunk):
        tokens, labels = next(iterator)
        tokens, labels = data_parallel_rows(tokens), data_parallel_rows(labels)
        per_token = chunk(tokens, position_ids.expand_as(tokens), attention_mask=None, labels=labels)

        def loss_func(output):
            loss = output.float().mean()
            # clone: the schedule divides the returned loss by the micro-batch count in place
            return loss, {"lm loss": loss.detach().clone()}

        return per_token, loss_func

    rows = MICRO_BATCH // parallel_state.get_data_parallel_world_size()  # per DP rank, see data_parallel_rows
    outputs = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=None,
        model=[model],
        num_microbatches=len(batches),
        seq_length=SEQ_LEN,
        micro_batch_size=rows,
        forward_only=forward_only,
    )
    if not parallel_state.is_pipeline_last_stage():
        return None
    loss = torch.stack([o["lm loss"] for o in outputs]).mean()
    dist.all_reduce(loss, group=parallel_state.get_data_parallel_group())
    return loss.item() / parallel_state.get_data_parallel_world_size()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    applied = megatron_patches.apply()
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        expert_model_parallel_size=args.ep,
    )
    torch.manual_seed(SEED)
    model_parallel_cuda_manual_seed(SEED)
    model, config = build_model(args)
    if args.save_init:
        save_checkpoint(model, args.save_init)
    if args.load_init:
        load_checkpoint(model, args.load_init)

    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=args.dist_opt)
    ddp_model = DistributedDataParallel(config, ddp_config, module=model)
    config.finalize_model_grads_func = finalize_model_grads
    optimizer_config = OptimizerConfig(
        optimizer="adam", lr=1e-2, clip_grad=1.0, use_distributed_optimizer=args.dist_opt
    )
    optimizer = get_megatron_optimizer(optimizer_config, [ddp_model])

    # The same batch every step: the loss then falls visibly, so later steps test the updates too.
    train_batches = make_batches(SEED, NUM_MICRO_BATCHES)
    losses = []
    for step in range(args.steps):
        ddp_model.zero_grad_buffer()
        optimizer.zero_grad()
        losses.append(run_schedule(ddp_model, config, train_batches, False))
        update_successful, _, _ = optimizer.step()
        assert update_successful, f"optimizer step {step} was skipped"

    if args.save_ckpt:
        save_checkpoint(model, args.save_ckpt)
    if args.load_ckpt:
        load_checkpoint(model, args.load_ckpt)
    eval_loss = None
    if args.eval:
        with torch.no_grad():
            eval_loss = run_schedule(ddp_model, config, make_batches(EVAL_SEED, NUM_MICRO_BATCHES), True)

    writes = (
        parallel_state.is_pipeline_last_stage()
        and parallel_state.get_tensor_model_parallel_rank() == 0
        and parallel_state.get_data_parallel_rank() == 0
    )
    if writes:
        layout = {
            "tp": args.tp,
            "pp": args.pp,
            "ep": args.ep,
            "sp": args.sp,
            "dist_opt": args.dist_opt,
            "moe": args.moe,
            "world": dist.get_world_size(),
        }
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "eval_loss": eval_loss, "layout": layout, "patches": applied}, f)
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":  # dist_checkpointing's writer starts processes by spawn, which re-imports __main__
    main()
