"""The colocated memory check: what DistFlow can hand back to the engines while it does not need it.

- ref offload (ref.offload, distflow.workers.megatron.offload.ParameterOffloader): a frozen 1B reference
  MegatronWorker keeps its weights in host memory and brings them onto the GPU only for its log-prob pass;
  CUDA memory after building it, inside onloaded(), after it, and the time of one offloaded log-prob pass.
- actor: what the trained actor holds (parameters, Megatron DDP's gradient buffers, the optimizer's states);
  DistFlow keeps the actor resident (actor.offload is refused; Megatron's optimizer_cpu_offload moves only
  the optimizer states), so these bytes stay on the GPU while the engines generate.
The staging buffers' release and restore is part of the staging check (staging.py); the SGLang engine's
own release (release_memory_occupation, torch_memory_saver) needs SGLang, absent on the GPU machine.
"""

import time

import torch
from gpu_checks.context import GIB, memory_reading, synchronize
from gpu_checks.models import build_worker, random_batch, write_model_dir


def check_memory(ctx, size: str) -> dict:
    device = ctx.torch_device
    out = {"actor": _actor_bytes(ctx.state.get("actor"))}
    if device.type != "cuda":
        return {**out, "ref_offload": "skipped: needs CUDA (on CPU the offloader has nothing to move)"}
    model_dir = write_model_dir(ctx.work_dir / f"model-{size}", size, max_positions=ctx.seq_len)
    readings = {"before": memory_reading(device)}
    ref = build_worker("ref", model_dir, ctx.layout, ctx.device, ctx.dtype, ctx.max_tokens, offload=True)
    readings["offloaded"] = memory_reading(device)
    tic = time.perf_counter()
    with ref.offloader.onloaded():
        synchronize(device)
        out["onload_s"] = time.perf_counter() - tic
        readings["onloaded"] = memory_reading(device)
        tic = time.perf_counter()
    synchronize(device)
    out["offload_s"] = time.perf_counter() - tic
    readings["offloaded_again"] = memory_reading(device)
    batch = random_batch(min(ctx.rows, 8), ctx.seq_len, ref.vocab_size, device)
    tic = time.perf_counter()
    logprobs, _ = ref.compute_logprobs(batch)  # onload, forward, offload
    synchronize(device)
    out["offloaded_logprob_pass_s"] = time.perf_counter() - tic
    out["offloaded_logprobs_finite"] = bool(torch.isfinite(logprobs).all())
    readings["after_logprob_pass"] = memory_reading(device)
    out["ref_parameters_gib"] = (
        sum(p.numel() * p.element_size() for m in ref.model for p in m.parameters()) / GIB
    )
    out["ref_readings"] = readings
    out["ref_released_gib"] = (
        readings["onloaded"]["allocated_gib"] - readings["offloaded_again"]["allocated_gib"]
    )
    del ref
    torch.cuda.empty_cache()
    return out


def _actor_bytes(actor) -> dict:
    if actor is None:
        return {"skipped": "no actor (the training check of the first size failed)"}
    params = sum(p.numel() * p.element_size() for m in actor.model for p in m.parameters())
    grads = sum(
        b.grad_data.numel() * b.grad_data.element_size()
        for m in actor.model
        for b in m.buffers + m.expert_parallel_buffers
    )
    # Megatron's mixed-precision optimizer: torch's Adam (.optimizer) over fp32 main copies of the bf16
    # parameters (fp32_from_float16_groups); in fp32 the parameters are Adam's own.
    adam = actor.optimizer.optimizer
    states = sum(
        t.numel() * t.element_size() for s in adam.state.values() for t in s.values() if torch.is_tensor(t)
    )
    mains = getattr(actor.optimizer, "fp32_from_float16_groups", [])
    main = sum(p.numel() * p.element_size() for group in mains for p in group)
    return {
        "parameters_gib": params / GIB,
        "grad_buffers_gib": grads / GIB,
        "adam_states_gib": states / GIB,
        "fp32_main_parameters_gib": main / GIB,
    }
