"""Statistics over prompt groups (the n samples of one prompt), and DAPO's filter of uninformative groups.

`group_ids` labels each sample's group: an integer tensor [batch] or a list of hashables (e.g. prompt uids).
Samples of a group need not be adjacent. Statistics are computed with index_add over dense group indices,
so there is no Python loop over samples.
"""

from typing import Sequence, Union

import torch

GroupIds = Union[torch.Tensor, Sequence]


def group_index(group_ids: GroupIds, device=None) -> tuple[torch.Tensor, int]:
    """Dense indices 0..G-1 (long tensor [batch]) for the labels in `group_ids`, and G."""
    if isinstance(group_ids, torch.Tensor):
        labels, index = torch.unique(group_ids, return_inverse=True)
        return index.to(device if device is not None else group_ids.device), len(labels)
    dense: dict = {}
    index = [dense.setdefault(label, len(dense)) for label in group_ids]
    return torch.tensor(index, dtype=torch.long, device=device), len(dense)


def group_statistics(rewards: torch.Tensor, group_ids: GroupIds):
    """Per-sample (group mean, unbiased group std, group size) of `rewards` [batch], each [batch].

    Std is unbiased (n - 1), as `torch.std` (the convention of verl's GRPO); a group of one has std 0.
    """
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    index, num_groups = group_index(group_ids, rewards.device)
    if index.shape != rewards.shape:
        raise ValueError(f"group_ids has {tuple(index.shape)} entries, rewards {tuple(rewards.shape)}")
    zeros = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    sizes = zeros.index_add(0, index, torch.ones_like(rewards))
    means = zeros.index_add(0, index, rewards) / sizes
    centred = rewards - means[index]
    variances = zeros.index_add(0, index, centred * centred) / (sizes - 1).clamp(min=1)
    return means[index], variances.sqrt()[index], sizes[index]


def filter_groups_with_variance(rewards: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
    """DAPO dynamic sampling: bool keep-mask [batch], False for every sample of a group whose rewards are all
    equal (such a group has zero advantage everywhere and only dilutes the batch). A group of one is dropped.

    Compares the group's max and min exactly: a computed std of equal floats can be a rounding error away from 0.
    """
    index, num_groups = group_index(group_ids, rewards.device)
    empty = torch.empty(num_groups, dtype=rewards.dtype, device=rewards.device)
    highest = empty.scatter_reduce(0, index, rewards, "amax", include_self=False)
    lowest = empty.scatter_reduce(0, index, rewards, "amin", include_self=False)
    return (highest != lowest)[index]
