"""The one dtype table: the config's allowed values are its names, and each name maps to its torch dtype."""

import typing

import pytest
import torch

from distflow.config import ConfigError, resolve
from distflow.config.dtypes import DTYPE_NAMES, torch_dtype
from distflow.config.schema import ModelConfig


def test_the_config_takes_the_tables_names():
    assert typing.get_args(typing.get_type_hints(ModelConfig)["dtype"]) == DTYPE_NAMES
    with pytest.raises(
        ConfigError, match=r"model.dtype='fp8' is not one of \['float32', 'bfloat16', 'float16'\]"
    ):
        resolve(None, ["model.dtype=fp8"])


def test_names_map_to_torch_dtypes():
    assert [torch_dtype(n) for n in DTYPE_NAMES] == [torch.float32, torch.bfloat16, torch.float16]
    with pytest.raises(
        ValueError, match=r"--dtype 'float64' is not one of \['bfloat16', 'float16', 'float32'\]"
    ):
        torch_dtype("float64", "--dtype")
