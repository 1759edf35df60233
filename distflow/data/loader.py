"""Per-rank prompt batches: a deterministic epoch order, partitioned over the rollout data-parallel ranks.

Epoch e's order is a permutation drawn from (seed, e) alone, so every rank computes the same one without
communication. A global batch is the next `batch_size` prompts of that order; rank r of R takes rows r::R of
it (batch_size / R prompts), which is the same as rank r reading rows r::R of the whole epoch order. The
last partial batch of an epoch is dropped so that every rank gets the same count. The state is (epoch,
position in the epoch, in prompts): it does not depend on R, so a run may resume on another DP size.
"""

from typing import Iterator, Sequence

import numpy as np

from distflow.data.prompts import Prompt


def epoch_order(num_rows: int, epoch: int, seed: int, shuffle: bool = True) -> list[int]:
    """The order of the rows in `epoch`: identical on every rank of one installation."""
    if not shuffle:
        return list(range(num_rows))
    return np.random.default_rng([seed, epoch]).permutation(num_rows).tolist()


class PromptLoader:
    """An endless iterator of this rank's batches (lists of `batch_size // world_size` prompts), epoch after
    epoch. `state_dict()` after a batch and `load_state_dict()` into a fresh loader: the next batches are
    exactly those the original would have yielded."""

    def __init__(
        self,
        dataset: Sequence[Prompt],
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 1,
    ):
        if batch_size % world_size:
            raise ValueError(
                f"data.train_batch_size={batch_size} must be divisible by the {world_size} rollout "
                "data-parallel ranks"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        if len(dataset) < batch_size:
            raise ValueError(
                f"data.train_batch_size={batch_size} is larger than the dataset ({len(dataset)} prompts)"
            )
        self.dataset, self.batch_size, self.rank, self.world_size = dataset, batch_size, rank, world_size
        self.shuffle, self.seed = shuffle, seed
        self.epoch, self.position = 0, 0
        self._order: tuple[int, list[int]] | None = None  # (epoch, order) cache

    @classmethod
    def from_config(cls, data_cfg, dataset, rank: int, world_size: int) -> "PromptLoader":
        return cls(dataset, data_cfg.train_batch_size, rank, world_size, data_cfg.shuffle, data_cfg.seed)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.dataset) // self.batch_size

    def __iter__(self) -> "PromptLoader":
        return self

    def __next__(self) -> list[Prompt]:
        if self.position + self.batch_size > len(self.dataset):
            self.epoch, self.position = self.epoch + 1, 0
        if self._order is None or self._order[0] != self.epoch:
            self._order = (self.epoch, epoch_order(len(self.dataset), self.epoch, self.seed, self.shuffle))
        global_batch = self._order[1][self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return [self.dataset[i] for i in global_batch[self.rank :: self.world_size]]

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_rows": len(self.dataset),
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict) -> None:
        expected = {"num_rows": len(self.dataset), "seed": self.seed, "shuffle": self.shuffle}
        changed = {k: (state[k], v) for k, v in expected.items() if k in state and state[k] != v}
        if changed:
            raise ValueError(
                f"cannot resume the data order: {changed} ((checkpoint, now)) differ, so the "
                "remaining batches would not be the ones the run would have seen"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def val_batches(
    dataset: Sequence[Prompt], batch_size: int, rank: int = 0, world_size: int = 1
) -> Iterator[list[Prompt]]:
    """One pass over `dataset` in file order: global batches of `batch_size`, rank r taking rows r::R of each.
    The last batch may be partial, and ranks may then get different counts (possibly none)."""
    for start in range(0, len(dataset), batch_size):
        rows = range(start, min(start + batch_size, len(dataset)))[rank::world_size]
        yield [dataset[i] for i in rows]
