"""Builds a role's Megatron-Core model for this rank: TransformerConfig, model chunks, DDP, optimizer.

Inputs are a model family spec (distflow.models) and the role's config section; the parallel layout is
already in Megatron's parallel_state (distflow.distributed). With virtual pipeline parallelism (vpp > 1)
a rank holds vpp model chunks (Megatron's interleaved schedule); everything here returns a list of
chunks, one element without it.
"""

import warnings
from dataclasses import dataclass

import torch

from distflow.config.schema import MegatronRoleConfig, OptimizerConfig


@dataclass
class GPTBuildSpec:
    """What GPTModel needs beyond TransformerConfig; produced by a family spec from a HF config."""

    vocab_size: int  # padded for TP (distflow.models.tp_sharding.padded_vocab_size)
    max_sequence_length: int
    tie_embeddings: bool
    rotary_base: float
    layer_spec: object
    rope_scaling: bool = (
        False  # Llama 3.1's "llama3" frequency scaling (distflow.models.spec.check_rope_scaling)
    )
    rope_scaling_factor: float = 8.0


def transformer_config(spec, hf_config: dict, role_cfg: MegatronRoleConfig, dtype: torch.dtype, device: str):
    """The role's TransformerConfig: the checkpoint's architecture (family spec), the layout in
    parallel_state, the role's recompute options, then its `megatron` passthrough fields on top.

    Parameters are fp32 (Megatron's optimizers keep fp32 masters; Float16Module casts for bf16/fp16).
    variable_seq_lengths is on with pipeline parallelism: every micro-batch is padded to its own length,
    so stages exchange each activation's shape before the activation (except where shapes_exchange_unsafe).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.transformer import TransformerConfig

    pp = ps.get_pipeline_model_parallel_world_size()
    vpp = ps.get_virtual_pipeline_model_parallel_world_size()
    layout = dict(
        tensor_model_parallel_size=ps.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp and vpp > 1 else None,
        context_parallel_size=ps.get_context_parallel_world_size(),
        expert_model_parallel_size=ps.get_expert_model_parallel_world_size(),
        expert_tensor_parallel_size=ps.get_expert_tensor_parallel_world_size(),
        sequence_parallel=role_cfg.sequence_parallel,
    )
    clash = set(layout) & set(role_cfg.megatron)
    assert not clash, f"megatron passthrough {sorted(clash)}: parallel sizes come from the role's layout"
    options = dict(
        use_cpu_initialization=device == "cpu",
        params_dtype=torch.float32,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        variable_seq_lengths=pp > 1 and not shapes_exchange_unsafe(pp, vpp),
        # Interleaved schedule: Megatron-LM's own setting (its batched P2P pairs a 2-rank ring's two
        # directions in posting order, which delivers gradients into activation buffers at pp=2).
        batch_p2p_comm=not (vpp and vpp > 1),
        recompute_granularity=role_cfg.recompute_granularity,
        recompute_method=role_cfg.recompute_method,
        recompute_num_layers=role_cfg.recompute_num_layers,
        # Megatron refuses the default allgather MoE dispatcher with variable_seq_lengths (dense models too).
        moe_token_dispatcher_type="alltoall",
    )
    if getattr(role_cfg, "moe_routing_replay", False):  # the actor's routers take the engine's routes
        options["moe_enable_routing_replay"] = True
    options.update(role_cfg.megatron)
    return TransformerConfig(**spec.transformer_config_kwargs(hf_config, **layout, **options))


def shapes_exchange_unsafe(pp: int, vpp: int | None) -> bool:
    """True where Megatron 0.16's shape exchange (variable_seq_lengths) cannot be used: the interleaved
    schedule with 2 pipeline ranks. There both neighbours are the same rank, and in the steady state a
    stage sends and receives in both directions at once; `P2PCommunicator._communicate_shapes` posts
    [send_prev, recv_prev, send_next, recv_next] on both ranks, so the peer's backward shape lands in the
    forward slot (its data path orders by rank parity, its shape path does not): with shapes that differ
    between micro-batches the stages hang (seen on gloo). Such layouts give every micro-batch one shape.
    """
    return pp == 2 and bool(vpp) and vpp > 1


def build_model_chunks(config, build: GPTBuildSpec, untie_output: bool = False) -> list:
    """This rank's GPTModel chunks (one per virtual pipeline stage), fp32 parameters.

    untie_output: build a separate output layer even if the checkpoint ties it to the embedding (the
    critic replaces it with a value head).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    vpp = config.virtual_pipeline_model_parallel_size
    chunks = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp else None
        chunks.append(
            GPTModel(
                config=config,
                transformer_layer_spec=build.layer_spec,
                vocab_size=build.vocab_size,
                max_sequence_length=build.max_sequence_length,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
                share_embeddings_and_output_weights=build.tie_embeddings and not untie_output,
                position_embedding_type="rope",
                vp_stage=stage,
                rope_scaling=build.rope_scaling,
                rope_scaling_factor=build.rope_scaling_factor,
                rotary_base=int(build.rotary_base)
                if float(build.rotary_base).is_integer()
                else build.rotary_base,
            )
        )
    return chunks


def wrap_for_training(chunks: list, config, use_distributed_optimizer: bool) -> list:
    """Megatron DDP around every chunk (grads in fp32 buffers, reduced over the data-parallel group)."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=use_distributed_optimizer
    )
    wrapped = [
        DistributedDataParallel(config, ddp_config, module=chunk, disable_bucketing=index > 0)
        for index, chunk in enumerate(wrap_for_inference(chunks, config))
    ]
    config.finalize_model_grads_func = finalize_model_grads
    return wrapped


def wrap_for_inference(chunks: list, config) -> list:
    """Float16Module around every chunk for bf16/fp16 compute; the chunks themselves otherwise."""
    if not (config.bf16 or config.fp16):
        return list(chunks)
    from megatron.core.transformer.module import Float16Module

    return [Float16Module(config, chunk) for chunk in chunks]


def build_optimizer(optim: OptimizerConfig, ddp_chunks: list, config, total_steps: int):
    """Megatron's optimizer (Adam, global-norm clipping, optionally distributed) and its LR schedule;
    optim.megatron adds Megatron OptimizerConfig fields (e.g. its optimizer CPU offload on GPU).

    Schedule convention: optimizer step k (1-based) uses lr(k), so the first update already moves
    (lr / warmup during a warm-up of `lr_warmup_steps` steps, not 0), warm-up ends at the full lr on step
    lr_warmup_steps, and decay reaches min_lr just after step `total_steps` (the last update is not wasted).
    """
    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    fields = dict(
        optimizer="adam",
        lr=optim.lr,
        min_lr=optim.min_lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.adam_beta1,
        adam_beta2=optim.adam_beta2,
        adam_eps=optim.adam_eps,
        clip_grad=optim.clip_grad,
        bf16=config.bf16,
        fp16=config.fp16,
        params_dtype=config.params_dtype,
        use_distributed_optimizer=optim.use_distributed_optimizer,
    )
    clash = set(fields) & set(optim.megatron)
    assert not clash, (
        f"optim.megatron passthrough {sorted(clash)}: set by DistFlow from optim.* / model.dtype"
    )
    if optim.megatron.get("optimizer_cpu_offload") and not torch.cuda.is_available():
        raise ValueError(
            "optim.megatron.optimizer_cpu_offload=true needs CUDA: Megatron's HybridDeviceOptimizer "
            "moves states over CUDA streams; on CPU the optimizer states already live in host memory"
        )
    with warnings.catch_warnings():  # "TE and Apex are not installed. Falling back to Torch optimizers."
        warnings.simplefilter("ignore")
        optimizer = get_megatron_optimizer(MegatronOptimizerConfig(**fields, **optim.megatron), ddp_chunks)
    decay_steps = max(total_steps, optim.lr_warmup_steps) + 1
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if optim.lr_warmup_steps else optim.lr,
        max_lr=optim.lr,
        min_lr=optim.min_lr,
        lr_warmup_steps=optim.lr_warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=optim.lr_decay_style,
        start_wd=optim.weight_decay,
        end_wd=optim.weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
    )
    scheduler.step(increment=1)  # lr(1) for the first update (see the convention above)
    return optimizer, scheduler
