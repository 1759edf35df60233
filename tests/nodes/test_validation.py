"""Validation (distflow.nodes.validation) on one rank (a 1-process gloo group), with a stand-in engine and reward pool: the
held-out rewards per data_source become the val/* metrics, and the sample rows hold the decoded texts."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from distflow.batch import PackedBatch
from distflow.data.prompts import Prompt
from distflow.nodes.context import NodeContext, StepState, Workers
from distflow.nodes.validation import validate
from distflow.workers.rollout.sample_packing import SampleInfo


class Tokenizer:
    eos_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids if i)


class Engine:
    """Answers prompt i with its own tokens (so the copy "scorer" below is right on even rows)."""

    owner, engine_index, num_engines = True, 0, 1

    def generate(self, prompts, eos, step, greedy):
        assert greedy
        ids, tokens, masks, infos = [], [], [], {}
        for p in prompts:
            response = list(p.input_ids) if p.index % 2 == 0 else [9]
            sample_id = 100 + p.index
            infos[sample_id] = SampleInfo(
                len(p.input_ids), response, "stop", p.data_source, p.ground_truth, {}
            )
            ids.append(sample_id)
            tokens.append(torch.tensor(list(p.input_ids) + response))
            masks.append(torch.tensor([0.0] * len(p.input_ids) + [1.0] * len(response)))
        return PackedBatch.from_samples(ids, ids, {"input_ids": tokens, "response_mask": masks}, infos=infos)


class Pool:
    def score_batch(self, samples, keys=None):
        rewards = [1.0 if s.response == s.ground_truth else 0.25 for s in samples]
        return rewards, {"reward/mean": sum(rewards) / len(rewards)}


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_validate_per_data_source_and_rows(one_rank_group):
    sources = ["openai/gsm8k", "openai/gsm8k", "copy", "copy", "copy"]
    val_set = [
        Prompt(i, [i + 1, i + 2], [], source, Tokenizer().decode([i + 1, i + 2]))
        for i, source in enumerate(sources)
    ]
    cfg = SimpleNamespace(
        data=SimpleNamespace(val_batch_size=2),
        tracking=SimpleNamespace(val_samples=3),
        reward=SimpleNamespace(env_reward_coef=0.0),
    )
    node_ctx = NodeContext(
        cfg,
        None,
        0,
        Tokenizer(),
        Workers(rollout=Engine(), reward_pool=Pool()),
        step=StepState(4, {"reward/mean": 0.5}),
    )  # the step's: validation must keep them
    metrics, rows = validate(node_ctx, val_set)
    # Rows 0, 2, 4 are copied (reward 1), rows 1, 3 are not (0.25).
    assert metrics == pytest.approx(
        {
            "val/reward/mean": 3.5 / 5,
            "val/accuracy": 3 / 5,
            "val/copy/reward/mean": 2.25 / 3,
            "val/copy/accuracy": 2 / 3,
            "val/openai/gsm8k/reward/mean": 1.25 / 2,
            "val/openai/gsm8k/accuracy": 1 / 2,
        }
    )
    assert node_ctx.step.metrics == {"reward/mean": 0.5}
    assert rows == [
        {
            "data_source": "openai/gsm8k",
            "prompt": "bc",
            "response": "bc",
            "ground_truth": "bc",
            "reward": 1.0,
        },
        {
            "data_source": "openai/gsm8k",
            "prompt": "cd",
            "response": "j",
            "ground_truth": "cd",
            "reward": 0.25,
        },
        {"data_source": "copy", "prompt": "de", "response": "de", "ground_truth": "de", "reward": 1.0},
    ]
