"""The tokens the simulator charges a Megatron pass: rows padded as the worker cuts its micro-batches."""

from types import SimpleNamespace

import numpy as np

from distflow.plan.simulate.padded_tokens import PaddedPass, padded_pass

# two prompts of two samples each, prompt-major: prompt 0's rows are 10 and 4 tokens, prompt 1's 6 and 6
LENGTHS = np.array([10, 4, 6, 6])


def role(**overrides):
    cfg = dict(
        use_dynamic_batch=True,
        max_tokens_per_micro_batch=100,
        micro_batch_size=1,
        mini_batch_size=0,
        sequence_parallel=False,
    )
    return SimpleNamespace(**{**cfg, **overrides})


def test_a_micro_batch_computes_every_row_padded_to_its_longest():
    # one micro-batch of the 100-token budget: 4 rows x 10
    assert padded_pass(LENGTHS, 2, 1, role(), 1, 1, 1, trains=True) == PaddedPass(40, 1)
    # a budget of 20: two micro-batches, the 10-token row alone and 6, 6, 4 padded to 6
    assert padded_pass(LENGTHS, 2, 1, role(max_tokens_per_micro_batch=20), 1, 1, 1, True) == PaddedPass(28, 2)
    # one row per micro-batch: no padding
    assert padded_pass(LENGTHS, 2, 1, role(use_dynamic_batch=False), 1, 1, 1, True) == PaddedPass(26, 4)


def test_the_busiest_data_parallel_rank_sets_the_pass():
    # prompt groups dealt to 2 DP ranks: 10 + 4 padded to 2 x 10 on rank 0, 6 + 6 on rank 1
    assert padded_pass(LENGTHS, 2, 2, role(), 1, 1, 1, True).tokens == 20
    # the long prompt last, on the last of 3 ranks: 2 x 11 there, against 2 x 3 and 2 x 6
    three = np.array([3, 3, 6, 6, 11, 4])
    assert padded_pass(three, 2, 3, role(), 1, 1, 1, True).tokens == 22


def test_sequence_parallel_and_the_pipelines_shapes_pad_further():
    # sequence parallel over TP 4: the longest row rounded up to 12
    assert padded_pass(LENGTHS, 2, 1, role(sequence_parallel=True), 4, 1, 1, True).tokens == 48
    # pp 2 x vpp 2 exchanges no shapes: both micro-batches of the 20 budget take (3 rows, 10)
    assert padded_pass(LENGTHS, 2, 1, role(max_tokens_per_micro_batch=20), 1, 2, 2, True) == PaddedPass(60, 2)


def test_each_mini_batch_is_cut_on_its_own():
    # one prompt per optimizer step: 2 x 10, then 2 x 6; a forward pass takes the whole batch at once
    assert padded_pass(LENGTHS, 2, 1, role(mini_batch_size=1), 1, 1, 1, trains=True).tokens == 32
    assert padded_pass(LENGTHS, 2, 1, role(mini_batch_size=1), 1, 1, 1, trains=False).tokens == 40
