"""The batch that leaves the rollout: an engine's RolloutSamples packed as one PackedBatch (token runs, no
padding) with the fields training reads (token ids, response mask, the engine's log-probs and, for MoE
routing replay, each token's routed experts), and each sample's SampleInfo in its `infos`. RolloutWorker
packs its returned batch and its streamed groups and samples here; tests pack directly, with no engine.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distflow.batch import PackedBatch


@dataclass
class SampleInfo:
    """What scoring needs about a sample and does not travel with the token tensors."""

    prompt_len: int
    response_ids: list[int]
    finish_reason: str
    data_source: str
    ground_truth: object
    extra_info: dict
    weight_version: int = 0
    """The engine weight version (completed syncs) that sampled the response (its first token)."""
    token_versions: list[int] | None = None
    """Partial rollouts: the version that sampled each response token (a weight update fell inside the
    generation); None: every token weight_version."""
    final_turn: int = 0
    """Multi-turn: where the policy's last turn starts in response_ids (outcome scorers read from there)."""
    env: dict | None = None
    """Multi-turn: the trajectory's record (turns, tool_calls, tool_errors, status, env_reward: the summed
    per-step rewards; RolloutSample.env)."""


def pack_samples(prompts, samples, base: int, routes_width: int | None = None) -> PackedBatch:
    """[(sample id, RolloutSample)] of this engine's partition (group ids are base + prompt index) as the
    batch that leaves the rollout: token ids, response mask and the engine's log-probs, one row per token
    (entry t belongs to token t, as in the Megatron worker), and each sample's SampleInfo.
    routes_width (MoE routing replay: layers x top_k): also `routed_experts`, int16 [tokens, routes_width],
    the experts the engine routed each token to (the last token, never fed back, repeats its predecessor's
    experts: its output feeds no log-prob)."""
    ids, groups, tokens, masks, logprobs, infos = [], [], [], [], [], {}
    routes = []
    for sample_id, s in samples:
        prompt = prompts[s.prompt_index]
        seq = list(prompt.input_ids) + list(s.response_ids)
        ids.append(sample_id)
        groups.append(base + s.prompt_index)
        tokens.append(torch.tensor(seq, dtype=torch.long))
        mask = torch.zeros(len(seq), dtype=torch.float32)
        # the policy's own tokens (multi-turn: not the environment's, which sit between its turns)
        mask[len(prompt.input_ids) :] = (
            1.0 if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=torch.float32)
        )
        masks.append(mask)
        lp = torch.zeros(len(seq), dtype=torch.float32)
        lp[len(prompt.input_ids) :] = torch.tensor(s.logprobs, dtype=torch.float32)
        logprobs.append(lp)
        if routes_width is not None:
            routes.append(_routes_of(s, len(seq), routes_width))
        infos[sample_id] = SampleInfo(
            len(prompt.input_ids),
            list(s.response_ids),
            s.finish_reason,
            prompt.data_source,
            prompt.ground_truth,
            prompt.extra_info,
            s.weight_version,
            s.token_versions,
            s.final_turn,
            s.env,
        )
    fields = {"input_ids": tokens, "response_mask": masks, "rollout_logprobs": logprobs}
    if routes_width is not None:
        fields["routed_experts"] = routes
    return PackedBatch.from_samples(ids, groups, fields, infos=infos)


def _routes_of(sample, tokens: int, width: int) -> torch.Tensor:
    routes = sample.routed_experts
    if routes is None or routes.shape != (tokens - 1, width):
        got = None if routes is None else tuple(routes.shape)
        raise RuntimeError(
            f"MoE routing replay: the engine returned routes of shape {got} for a sample of {tokens} tokens; "
            f"expected ({tokens - 1}, {width}) (layers x top_k per token but the last)"
        )
    routes = torch.from_numpy(routes.astype(np.int16))
    return torch.cat([routes, routes[-1:]]) if tokens > 1 else routes.new_zeros(1, width)


def routes_width(model_path) -> int:
    """Routed-expert entries per token of a MoE model: its layers x the experts each token goes to."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    return config["num_hidden_layers"] * config["num_experts_per_tok"]
