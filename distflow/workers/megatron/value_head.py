"""The critic's scalar value head: replaces GPTModel's vocabulary output layer on the last pipeline stage.

GPTModel calls `output_layer(hidden, weight=..., runtime_gather_output=...)` and expects (output, bias);
the head keeps that contract, so the rest of GPTModel (and Megatron's schedules) is unchanged. Its weight
is replicated over tensor-parallel ranks: every TP rank computes the same values from the same hidden
states, hence the same gradient (Megatron counts a non-TP parameter once in the grad norm).
"""

import torch


class ValueHead(torch.nn.Module):
    """hidden [S, B, H] (sequence-split over TP under sequence parallelism) -> values [S, B, 1]."""

    def __init__(self, config, init_seed: int = 0):
        super().__init__()
        self.sequence_parallel = config.sequence_parallel
        weight = torch.empty(1, config.hidden_size, dtype=config.params_dtype)
        # A fixed generator: every TP rank (and every layout) starts from the same head.
        generator = torch.Generator().manual_seed(init_seed)
        weight.normal_(mean=0.0, std=config.init_method_std, generator=generator)
        self.weight = torch.nn.Parameter(weight)

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            # The head is replicated, not vocabulary-parallel: the backward keeps this rank's sequence
            # chunk of the (identical) full gradient instead of summing partial gradients over TP.
            hidden_states = gather_from_sequence_parallel_region(
                hidden_states, tensor_parallel_output_grad=False
            )
        return torch.nn.functional.linear(hidden_states, self.weight), None


def install_value_head(gpt_model, config, init_seed: int = 0) -> None:
    """Swaps the last stage's output layer for a ValueHead (call before DDP wraps the model)."""
    assert gpt_model.post_process, "the value head belongs to the last pipeline stage"
    assert not gpt_model.share_embeddings_and_output_weights, (
        "build the critic with untied output weights: its head does not share the embedding"
    )
    gpt_model.output_layer = ValueHead(config, init_seed)
