"""Runs Megatron's own pipeline schedule (no pipelining, 1F1B or interleaved) over padded micro-batches.

A micro-batch is a dict of [rows, length] tensors holding at least `input_ids` (right-padded, causal
attention, positions 0..length-1). Micro-batches may differ in rows and length: with pipeline
parallelism the model config must have variable_seq_lengths=True (builder.transformer_config sets it), so
stages exchange each activation's shape first.
"""

import functools

import torch


def run_schedule(
    model_chunks: list, micro_batches: list[dict], forward_only: bool, output_fn, before_forward=None
) -> list:
    """Forward (and backward unless forward_only) of every micro-batch through this rank's chunks.

    output_fn(model_output, micro_batch) -> (loss, payload) runs on the last pipeline stage, where
    model_output is that stage's output ([rows, length, ...]: vocab-parallel logits, or values for the
    critic). Megatron divides the returned loss by the number of micro-batches before backward (and DDP
    averages gradients over data-parallel ranks): the caller scales for that. Returns the payloads in
    micro-batch order on the last stage, [] elsewhere. before_forward(model_chunk, micro_batch), when given,
    runs just before each chunk's forward of a micro-batch (MoE routing replay sets the routes there).
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator, model):
        mb = next(data_iterator)
        if before_forward is not None:
            before_forward(model, mb)
        tokens = mb["input_ids"]
        positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
        # attention_mask=None: Megatron's causal mask; right padding never influences earlier tokens.
        return model(tokens, positions, attention_mask=None), functools.partial(output_fn, micro_batch=mb)

    # The interleaved schedule reads data_iterator[chunk]: each chunk walks the same micro-batches.
    iterators = [iter(micro_batches) for _ in model_chunks] if len(model_chunks) > 1 else iter(micro_batches)
    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iterators,
        model=model_chunks,
        num_microbatches=len(micro_batches),
        seq_length=max(mb["input_ids"].shape[1] for mb in micro_batches),
        micro_batch_size=max(mb["input_ids"].shape[0] for mb in micro_batches),
        forward_only=forward_only,
    )
