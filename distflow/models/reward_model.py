"""Reward models: Hugging Face `*ForSequenceClassification` checkpoints with one label, read as their family.

A reward model is the family's decoder (`model.*`, the same tensors as the causal LM) with a `score`
linear layer [1, hidden] instead of the LM head; its score is that layer applied to the hidden state of
the sequence's last token. `RewardModelCheckpoint` presents such a checkpoint to the family spec as the
causal LM it is built on, with the output layer taken to be tied (so the mapping never asks for the LM
head the checkpoint does not have) and `score_weight()` for the head, which the Megatron worker puts in
place of the output layer.
"""

import copy

import torch

from distflow.models.conversion import HFCheckpoint

SUFFIX = "ForSequenceClassification"
SCORE_WEIGHT = "score.weight"


class NotARewardModel(ValueError):
    """The checkpoint is not a one-label sequence-classification model of a supported family."""


def causal_architecture(architecture: str) -> str:
    """`Qwen2ForSequenceClassification` -> `Qwen2ForCausalLM`."""
    return architecture[: -len(SUFFIX)] + "ForCausalLM"


class RewardModelCheckpoint(HFCheckpoint):
    def __init__(self, model_dir):
        super().__init__(model_dir)
        architectures = self.config.get("architectures") or []
        source = self.model_dir / "config.json"
        if not architectures or not architectures[0].endswith(SUFFIX):
            raise NotARewardModel(
                f"{source}: architectures={architectures} is not a reward model; expected "
                f"'<Family>{SUFFIX}' (e.g. Qwen2{SUFFIX}, Llama{SUFFIX}) with num_labels=1"
            )
        labels = len(self.config.get("id2label") or {"0": 0})
        if labels != 1:
            raise NotARewardModel(
                f"{source}: id2label has {labels} labels; a reward model has exactly one (a scalar score)"
            )
        if SCORE_WEIGHT not in self.names():
            raise NotARewardModel(f"{self.model_dir}: no {SCORE_WEIGHT!r} tensor (the reward head)")
        self.classifier_config = self.config
        self.config = copy.deepcopy(self.config)
        self.config["architectures"] = [causal_architecture(architectures[0])]
        self.config["tie_word_embeddings"] = (
            True  # the LM head is absent: read the (skipped) output layer from
        )
        # the embedding rather than from a tensor that does not exist

    def score_weight(self) -> torch.Tensor:
        """The reward head, [1, hidden]."""
        return self.get(SCORE_WEIGHT)
