"""A position-weighted checksum of a tensor's bits that senders can compute piece by piece (sync.verify).

checksum(T) = sum over elements i of bits(T[i]) * w(i)  mod 2**61 - 1, where bits() reads the element's
bit pattern as a signed integer and w(i) depends on the element's flat index i in T. Because it is a sum
over elements, each training rank computes the share of the pieces it wrote (`region_checksum`, with the
indices those pieces have in the target tensor), the shares add up to the checksum of the whole tensor,
and the engine side computes the same number from its parameter: no rank needs the whole tensor. Exact
integer arithmetic (int64, reduced modulo a prime before it can overflow), so any summation order and
device give the same value. It detects changed, swapped or missing elements; it is not cryptographic.
"""

import torch

MODULUS = 2**61 - 1
_CHUNK = 1 << 22  # elements per step: bounds the temporary int64 tensors
_WORD = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def checksum(tensor: torch.Tensor) -> int:
    return region_checksum(tensor, tuple(tensor.shape), tuple((0, n) for n in tensor.shape))


def region_checksum(values: torch.Tensor, target_shape: tuple, region) -> int:
    """The share of `values`, written at `region` of a tensor of `target_shape`, in that tensor's checksum."""
    if values.numel() == 0:
        return 0
    assert values.element_size() in _WORD, f"checksum of {values.dtype}: elements of 1, 2 or 4 bytes only"
    region = tuple(region) + tuple((0, n) for n in target_shape[len(region) :])
    strides = [1] * len(target_shape)
    for d in range(len(target_shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * target_shape[d + 1]
    words = values.contiguous().view(_WORD[values.element_size()])
    rows = region[0][1]
    row_elems = max(1, values.numel() // rows)
    step = max(1, _CHUNK // row_elems)
    total = 0
    for first in range(0, rows, step):
        n = min(step, rows - first)
        sub = ((region[0][0] + first, n),) + region[1:]
        index = _flat_index(sub, strides, values.device)
        total += _mod_sum(words[first : first + n].to(torch.int64).reshape(-1) * _weight(index.reshape(-1)))
    return total % MODULUS


def combine(shares) -> int:
    return sum(shares) % MODULUS


def _flat_index(region, strides, device) -> torch.Tensor:
    index = torch.zeros((), dtype=torch.int64, device=device)
    for d, (start, n) in enumerate(region):
        axis = torch.arange(start, start + n, dtype=torch.int64, device=device) * strides[d]
        index = index.unsqueeze(-1) + axis.reshape((1,) * d + (n,))
    return index


def _weight(index: torch.Tensor) -> torch.Tensor:
    """w(i) in [1, 2**20]: a multiplicative hash of the flat index (|bits * w| < 2**52)."""
    return (index * 0x9E3779B1) % (1 << 20) + 1


def _mod_sum(x: torch.Tensor) -> int:
    x = torch.remainder(x, MODULUS)  # in [0, 2**61)
    while x.numel() > 1:  # pairwise sums stay below 2**62
        if x.numel() % 2:
            x = torch.cat([x, x.new_zeros(1)])
        x = torch.remainder(x[0::2] + x[1::2], MODULUS)
    return int(x.item()) if x.numel() else 0
