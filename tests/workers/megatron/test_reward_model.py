"""Reward models (HF *ForSequenceClassification, one label) in Megatron: MegatronWorker role "reward" gives
transformers' scores on the same weights, at TP1, TP2 and PP2; bad checkpoints are refused by name."""

import json
from pathlib import Path

import pytest
import torch
from worker_reference import make_batch

from distflow.models.reward_model import NotARewardModel, RewardModelCheckpoint
from distflow.models.tiny import make_tiny_model
from distflow.models.tiny_reward_model import make_tiny_reward_model
from distflow.testing.launch import torchrun

JOB = Path(__file__).parent / "jobs" / "reward_model_job.py"
SCORE_TOL = 1e-4  # fp32 max abs diff; scores are O(1)


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    """(model dir, batch path, transformers' scores), with vocab 300 so TP pads the embedding."""
    from transformers import AutoModelForSequenceClassification

    root = tmp_path_factory.mktemp("reward_model")
    model_dir = make_tiny_reward_model("qwen2", root / "rm", vocab=300)
    batch = make_batch(vocab=300, seed=3)
    hf = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # one row at a time: no padding, the pooled token is the last one
        scores = torch.stack(
            [
                hf(input_ids=ids[mask.bool()][None]).logits[0, 0]
                for ids, mask in zip(batch["input_ids"], batch["attention_mask"])
            ]
        )
    path = root / "batch.pt"
    torch.save(batch, path)
    return model_dir, path, scores


@pytest.mark.slow
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)])
def test_megatron_reward_scores_equal_hf(reward_model, tp, pp, tmp_path):
    model_dir, batch, hf_scores = reward_model
    out = tmp_path / "scores.pt"
    torchrun(
        JOB,
        nproc=tp * pp,
        args=["--model", model_dir, "--batch", batch, "--tp", tp, "--pp", pp, "--out", out],
        timeout_s=300,
    )
    scores = torch.load(out)
    assert scores.shape == hf_scores.shape
    assert hf_scores.std() > 0.1, "the scores should differ between rows for the test to mean anything"
    assert (scores - hf_scores).abs().max() <= SCORE_TOL, (scores, hf_scores)


def test_causal_lm_is_not_a_reward_model(tmp_path):
    model_dir = make_tiny_model("qwen2", tmp_path / "lm")
    with pytest.raises(
        NotARewardModel, match="Qwen2ForCausalLM.*is not a reward model.*Qwen2ForSequenceClassification"
    ):
        RewardModelCheckpoint(model_dir)


def test_multi_label_classifier_is_refused(tmp_path):
    model_dir = make_tiny_reward_model("qwen2", tmp_path / "rm")
    config = json.loads((model_dir / "config.json").read_text())
    config["id2label"] = {"0": "bad", "1": "good"}
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotARewardModel, match="2 labels; a reward model has exactly one"):
        RewardModelCheckpoint(model_dir)
