"""Rectangular regions of tensors: (start, length) along each dimension, as the weight plan names them."""

import torch

Region = tuple[tuple[int, int], ...]


def full_region(shape) -> Region:
    return tuple((0, n) for n in shape)


def volume(region: Region) -> int:
    v = 1
    for _, n in region:
        v *= n
    return v


def narrow(tensor: torch.Tensor, region: Region) -> torch.Tensor:
    """The view of `tensor` covering `region` (its leading dimensions; the rest whole)."""
    for dim, (start, length) in enumerate(region):
        tensor = tensor.narrow(dim, start, length)
    return tensor
