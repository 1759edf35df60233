"""The one dtype table: the names the config, the checkpoints and the tools use, and their torch dtypes.

model.dtype takes these names (schema.py), HF configs and Megatron checkpoint records store them, and the
Megatron builder, the weight sync and the converters turn them into torch dtypes through `torch_dtype`.
"""

import typing
from typing import Literal

DtypeName = Literal["float32", "bfloat16", "float16"]
DTYPE_NAMES: tuple[str, ...] = typing.get_args(DtypeName)


def torch_dtype(name: str, what: str = "dtype"):
    """The torch dtype named `name` (one of DTYPE_NAMES); ValueError naming `what` otherwise."""
    import torch  # noqa: PLC0415 - the config loads without torch, so a bad config fails in a second

    if name not in DTYPE_NAMES:
        raise ValueError(f"{what} {name!r} is not one of {sorted(DTYPE_NAMES)}")
    return getattr(torch, name)
