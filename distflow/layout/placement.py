"""Placement: which ranks train, which host rollout engines, and how ranks group into engines.

colocated (default): every rank trains and hosts its share of an engine; an engine spans engine_tp
consecutive ranks (its first rank owns the sglang.Engine object). disaggregated: the first
world - rollout.num_ranks ranks train, the last rollout.num_ranks host engines only.
"""
from dataclasses import dataclass
from typing import Literal

from distflow.layout.parallel import LayoutError
from distflow.models.shape import ModelShape


@dataclass(frozen=True)
class Placement:
    kind: Literal["colocated", "disaggregated"]
    world_size: int
    train_ranks: tuple[int, ...]
    rollout_ranks: tuple[int, ...]
    engine_tp: int

    @classmethod
    def create(cls, kind: str, world_size: int, engine_tp: int, num_rollout_ranks: int = 0) -> "Placement":
        if world_size < 1:
            raise LayoutError(f"world size {world_size} must be >= 1")
        if kind == "colocated":
            train = rollout = tuple(range(world_size))
        elif kind == "disaggregated":
            if not 1 <= num_rollout_ranks < world_size:
                raise LayoutError(f"rollout.num_ranks={num_rollout_ranks} must leave training ranks: it has to be "
                                  f"between 1 and world size - 1 = {world_size - 1}")
            train = tuple(range(world_size - num_rollout_ranks))
            rollout = tuple(range(world_size - num_rollout_ranks, world_size))
        else:
            raise LayoutError(f"rollout.placement={kind!r} is not one of ['colocated', 'disaggregated']")
        if len(rollout) % engine_tp:
            raise LayoutError(f"rollout.engine_tp={engine_tp} does not divide the {len(rollout)} rollout ranks "
                              f"({kind} placement, world size {world_size})")
        return cls(kind=kind, world_size=world_size, train_ranks=train, rollout_ranks=rollout, engine_tp=engine_tp)

    @property
    def num_engines(self) -> int:
        return len(self.rollout_ranks) // self.engine_tp

    def engine_ranks(self, engine: int) -> tuple[int, ...]:
        """The ranks whose devices engine `engine` spans; the first one owns the sglang.Engine object."""
        return self.rollout_ranks[engine * self.engine_tp:(engine + 1) * self.engine_tp]

    def engine_of(self, rank: int) -> int | None:
        if rank not in self.rollout_ranks:
            return None
        return self.rollout_ranks.index(rank) // self.engine_tp

    def owns_engine(self, rank: int) -> bool:
        engine = self.engine_of(rank)
        return engine is not None and self.engine_ranks(engine)[0] == rank

    def validate_for_model(self, shape: ModelShape) -> None:
        if shape.num_heads % self.engine_tp:
            raise LayoutError(f"rollout.engine_tp={self.engine_tp} does not divide the model's "
                              f"{shape.num_heads} attention heads")
        kv = shape.num_kv_heads
        if kv % self.engine_tp and self.engine_tp % kv:
            raise LayoutError(f"rollout.engine_tp={self.engine_tp} and the model's {kv} KV heads: one must divide "
                              "the other (SGLang splits KV heads, or replicates them when engine_tp > KV heads)")
