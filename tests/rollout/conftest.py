"""Shared fixtures for the rollout tests: one tiny Qwen2 checkpoint per session."""

import pytest

from distflow.models.tiny import make_tiny_model


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    """A tiny Qwen2 directory (hidden 64, 2 layers, vocab 512, tied embeddings), float32 weights."""
    return make_tiny_model("qwen2", tmp_path_factory.mktemp("rollout") / "tiny-qwen2")
