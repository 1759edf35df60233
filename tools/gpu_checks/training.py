"""The Megatron check: DistFlow's actor trains a random-weight model on packed micro-batches, and its log-prob
pass runs over the same rows; tokens/s and MFU of both.

Each timed call is DistFlow's own MegatronWorker method: compute_logprobs (the old_logprob node) and
train_step with a PPO clipped loss (the train_actor node: Megatron's schedule over micro-batches packed to
a token budget, DDP, Megatron's Adam). One warm-up call of each first (kernels, allocator, Adam's states).
"""

import math
import time

import torch
from gpu_checks import flops
from gpu_checks.context import GIB, memory_reading, timed
from gpu_checks.models import build_worker, parameter_count, random_batch, write_model_dir

from distflow.algorithms.policy_loss import ppo_clip_loss
from distflow.workers.megatron import batching


def check_training(ctx, size: str, keep_actor: bool = False) -> dict:
    device = ctx.torch_device
    model_dir = write_model_dir(ctx.work_dir / f"model-{size}", size, max_positions=ctx.seq_len)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    out = {"model": size, "dtype": ctx.dtype, "layer_spec": "local (no Transformer Engine)"}
    tic = time.perf_counter()
    actor = build_worker("actor", model_dir, ctx.layout, ctx.device, ctx.dtype, ctx.max_tokens)
    out["build_s"] = time.perf_counter() - tic
    out["memory_after_build"] = memory_reading(device)
    out.update(parameter_count(actor))
    config = actor.config
    shape = dict(
        matmul_parameters=out["matmul_parameters"],
        layers=config.num_layers,
        attention_width=config.num_attention_heads * config.kv_channels,
    )

    batch = random_batch(ctx.rows, ctx.seq_len, actor.vocab_size, device)
    lengths = batching.sequence_lengths(batch["attention_mask"])
    groups = batching.token_budget_micro_batches(lengths, ctx.max_tokens)
    out.update(
        rows=ctx.rows,
        tokens=sum(lengths),
        padded_tokens=sum(batching.padded_cost(lengths, g) for g in groups),
        micro_batches=len(groups),
        max_tokens_per_micro_batch=ctx.max_tokens,
    )
    peak, peak_source = flops.device_peak(ctx.peak_tflops)
    out["peak_tflops"], out["peak_source"] = (peak / 1e12 if peak else None), peak_source

    actor.compute_logprobs(batch)  # warm-up
    seconds, (logprobs, _) = timed(lambda: actor.compute_logprobs(batch), ctx.repeats, device)
    _throughput(out, "logprob", seconds, sum(lengths), flops.forward_flops(lengths, **shape), peak)
    out["logprobs_finite"] = bool(torch.isfinite(logprobs).all())

    batch["old_logprobs"] = logprobs  # as the old_logprob node hands them to train_actor

    def loss_fn(logprob, entropy, mb):
        return ppo_clip_loss(logprob, mb["old_logprobs"], mb["advantages"], mb["response_mask"])

    actor.train_step(batch, loss_fn)  # warm-up: Adam's states are made here
    out["memory_after_first_step"] = memory_reading(device)
    seconds, metrics = timed(lambda: actor.train_step(batch, loss_fn), ctx.repeats, device)
    _throughput(out, "train", seconds, sum(lengths), flops.train_flops(lengths, **shape), peak)
    out.update(
        loss=metrics["loss"],
        grad_norm=metrics["grad_norm"],
        skipped_steps=metrics["skipped_steps"],
        loss_finite=math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"]),
    )
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / GIB
    if keep_actor:
        ctx.state["actor"] = actor
    return out


def _throughput(out: dict, name: str, seconds: float, tokens: int, model_flops: float, peak) -> None:
    out[f"{name}_s"] = seconds
    out[f"{name}_tokens_per_s"] = tokens / seconds
    out[f"{name}_tflops"] = model_flops / seconds / 1e12
    out[f"{name}_mfu"] = model_flops / seconds / peak if peak else None
