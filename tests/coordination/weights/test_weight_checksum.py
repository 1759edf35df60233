"""The verify checksum: shares of pieces add up to the whole tensor's checksum, and it sees changed,
swapped and moved elements in every engine dtype."""

import pytest
import torch

from distflow.coordination.weights import checksum as cs
from distflow.coordination.weights.regions import narrow


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_shares_of_pieces_add_up_to_the_whole(dtype):
    t = torch.randn(37, 20, generator=torch.Generator().manual_seed(0)).to(dtype)
    regions = [((0, 10), (0, 20)), ((10, 27), (0, 7)), ((10, 27), (7, 13))]  # rows, then a column split
    shares = [cs.region_checksum(narrow(t, r).clone(), tuple(t.shape), r) for r in regions]
    assert cs.combine(shares) == cs.checksum(t)


def test_one_dimensional_and_zero_padding():
    t = torch.randn(100)
    padded = torch.cat([t, torch.zeros(28)])
    # zero rows contribute nothing: the share of the real rows is the padded tensor's checksum
    assert cs.region_checksum(t, (128,), ((0, 100),)) == cs.checksum(padded)


def test_changes_swaps_and_shifts_are_seen():
    t = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    base = cs.checksum(t)
    changed = t.clone()
    changed[3, 5] = torch.nextafter(changed[3, 5], torch.tensor(10.0))  # one ulp
    swapped = t.clone()
    swapped[[1, 2]] = swapped[[2, 1]]
    shifted = torch.roll(t, 1, dims=1)
    assert len({base, cs.checksum(changed), cs.checksum(swapped), cs.checksum(shifted)}) == 4


def test_large_tensors_are_processed_in_chunks():
    t = torch.randn(3000, 2000)  # 6M elements > one chunk
    halves = cs.region_checksum(t[:1500].clone(), tuple(t.shape), ((0, 1500),)) + cs.region_checksum(
        t[1500:].clone(), tuple(t.shape), ((1500, 1500),)
    )
    assert halves % cs.MODULUS == cs.checksum(t)
