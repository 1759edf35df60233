"""The engine's routes of a sample (MoE routing replay): decoded from SGLang's output, and packed as one
row per token beside the tokens. Pure; the real engine and Megatron are in
tests/workers/megatron/test_routing_replay.py."""

import base64
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from distflow.workers.rollout.sample_packing import pack_samples
from distflow.workers.rollout.sglang_engine import EngineCallError, RolloutSample, routed_experts_of

LAYERS, TOP_K = 2, 2


def _output(prompt_tokens: int, response: list[int], routes: np.ndarray | None) -> dict:
    meta = {"prompt_tokens": prompt_tokens, "id": "r0"}
    if routes is not None:
        meta["routed_experts"] = base64.b64encode(routes.astype(np.int32).tobytes()).decode()
    return {"output_ids": response, "meta_info": meta}


def test_routes_decode_one_row_per_token_but_the_last():
    routes = np.arange(6 * LAYERS * TOP_K).reshape(6, LAYERS, TOP_K) % 4  # prompt 3 + response 4 - 1 tokens
    decoded = routed_experts_of(_output(3, [7, 8, 9, 2], routes))
    assert decoded.dtype == np.int32 and decoded.shape == (6, LAYERS * TOP_K)
    assert np.array_equal(decoded, routes.reshape(6, -1))
    assert routed_experts_of(_output(3, [7], None)) is None


def test_routes_that_do_not_split_over_the_tokens_are_named():
    with pytest.raises(
        EngineCallError, match="7 routed-expert entries do not split over the 6 tokens of request r0"
    ):
        routed_experts_of(
            {
                "output_ids": [7, 8, 9, 2],
                "meta_info": {
                    "prompt_tokens": 3,
                    "id": "r0",
                    "routed_experts": base64.b64encode(np.zeros(7, np.int32).tobytes()).decode(),
                },
            }
        )


def _sample(prompt_index: int, response: list[int], routes) -> RolloutSample:
    return RolloutSample(prompt_index, response, [-0.5] * len(response), "stop", routed_experts=routes)


def test_pack_samples_carries_the_routes_as_a_token_field():
    prompts = [SimpleNamespace(input_ids=[1, 2, 3], data_source="d", ground_truth="g", extra_info={})]
    width = LAYERS * TOP_K
    routes = [np.full((3 + n - 1, width), i, dtype=np.int32) for i, n in enumerate((2, 4))]
    routes[1][-1] = [3, 2, 1, 0]
    batch = pack_samples(
        prompts, [(10, _sample(0, [5, 6], routes[0])), (11, _sample(0, [5, 6, 7, 8], routes[1]))], 0, width
    )
    assert batch.fields["routed_experts"].dtype == torch.int16
    assert batch.row_counts["routed_experts"].tolist() == batch.row_counts["input_ids"].tolist() == [5, 7]
    second = batch.fields["routed_experts"][5:]
    assert torch.equal(second[:6], torch.from_numpy(routes[1]).to(torch.int16))
    assert second[6].tolist() == [3, 2, 1, 0]  # the last token (never fed back) repeats its predecessor's
    assert "routed_experts" not in pack_samples(prompts, [(10, _sample(0, [5, 6], None))], 0).fields
    empty = pack_samples(prompts, [], 0, width)  # an engine left without samples still has the field
    assert len(empty.fields["routed_experts"]) == 0


def test_a_sample_without_routes_is_named_when_replay_needs_them():
    prompts = [SimpleNamespace(input_ids=[1, 2, 3], data_source="d", ground_truth="g", extra_info={})]
    with pytest.raises(
        RuntimeError, match=r"routes of shape None for a sample of 5 tokens; expected \(4, 4\)"
    ):
        pack_samples(prompts, [(10, _sample(0, [5, 6], None))], 0, LAYERS * TOP_K)
