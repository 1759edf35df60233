"""Tiny reward models for tests and CPU examples: a tiny causal LM of a family turned into its one-label
`*ForSequenceClassification` (same decoder weights, a seeded random `score` head), saved with its tokenizer."""

import shutil
import tempfile
from pathlib import Path

import torch

from distflow.models.tiny import make_tiny_model

HEAD_STD = 0.5  # large enough that scores of different sequences differ visibly in tests


def make_tiny_reward_model(family: str, out_dir, seed: int = 0, **sizes) -> Path:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: PLC0415 - transformers' model classes are heavy: only when a model is made

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        base = make_tiny_model(family, Path(tmp) / "base", **sizes)
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
        with torch.no_grad():
            model.score.weight.normal_(0.0, HEAD_STD, generator=torch.Generator().manual_seed(seed))
        model.config.pad_token_id = tokenizer.pad_token_id
        if out_dir.exists():
            shutil.rmtree(out_dir)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return out_dir
