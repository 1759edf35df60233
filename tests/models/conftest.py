"""Tiny model directories of every family, shared by the tests of this package (built once per session)."""

import pytest

from distflow.models.tiny import FAMILIES, make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tiny")
    return {family: make_tiny_model(family, root / family) for family in FAMILIES}
