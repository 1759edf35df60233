"""When a patch is needed: each patch module's needed() is one of these."""

import importlib.util

import torch


def cuda_missing() -> bool:
    """The CUDA patches only turn calls that would raise into CPU equivalents; with a GPU they stay off."""
    return not torch.cuda.is_available()


def transformer_engine_missing() -> bool:
    # find_spec, not import: importing TE is slow, and a broken TE install is Megatron's problem to report.
    return importlib.util.find_spec("transformer_engine") is None
