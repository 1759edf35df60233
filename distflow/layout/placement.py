"""Placement: which ranks train, which host rollout engines, and how ranks group into engines.

colocated (default): every rank trains and hosts its share of an engine; an engine spans engine_tp
consecutive ranks (its first rank owns the sglang.Engine object; an engine over engine_nnodes nodes has
engine_tp / engine_nnodes of them on each, whose first starts that node's SGLang processes).
disaggregated: the first world - rollout.num_ranks ranks train, the last rollout.num_ranks host engines only.
"""

from dataclasses import dataclass
from typing import Literal

from distflow.layout.model_shape import ModelShape
from distflow.layout.parallel import LayoutError


@dataclass(frozen=True)
class Placement:
    kind: Literal["colocated", "disaggregated"]
    world_size: int
    train_ranks: tuple[int, ...]
    rollout_ranks: tuple[int, ...]
    engine_tp: int
    engine_nnodes: int = 1
    """Nodes one engine spans: engine_tp / engine_nnodes consecutive ranks of it on each."""

    @classmethod
    def create(
        cls, kind: str, world_size: int, engine_tp: int, num_rollout_ranks: int = 0, engine_nnodes: int = 1
    ) -> "Placement":
        if world_size < 1:
            raise LayoutError(f"world size {world_size} must be >= 1")
        if kind == "colocated":
            train = rollout = tuple(range(world_size))
        elif kind == "disaggregated":
            if not 1 <= num_rollout_ranks < world_size:
                raise LayoutError(
                    f"rollout.num_ranks={num_rollout_ranks} must leave training ranks: it has to be "
                    f"between 1 and world size - 1 = {world_size - 1}"
                )
            train = tuple(range(world_size - num_rollout_ranks))
            rollout = tuple(range(world_size - num_rollout_ranks, world_size))
        else:
            raise LayoutError(f"rollout.placement={kind!r} is not one of ['colocated', 'disaggregated']")
        if len(rollout) % engine_tp:
            raise LayoutError(
                f"rollout.engine_tp={engine_tp} does not divide the {len(rollout)} rollout ranks "
                f"({kind} placement, world size {world_size})"
            )
        if engine_nnodes < 1 or engine_tp % engine_nnodes:
            raise LayoutError(
                f"rollout.engine_nnodes={engine_nnodes} must divide rollout.engine_tp={engine_tp}"
            )
        return cls(
            kind=kind,
            world_size=world_size,
            train_ranks=train,
            rollout_ranks=rollout,
            engine_tp=engine_tp,
            engine_nnodes=engine_nnodes,
        )

    @property
    def num_engines(self) -> int:
        return len(self.rollout_ranks) // self.engine_tp

    def engine_ranks(self, engine: int) -> tuple[int, ...]:
        """The ranks whose devices engine `engine` spans; the first one owns the sglang.Engine object."""
        return self.rollout_ranks[engine * self.engine_tp : (engine + 1) * self.engine_tp]

    def engine_of(self, rank: int) -> int | None:
        if rank not in self.rollout_ranks:
            return None
        return self.rollout_ranks.index(rank) // self.engine_tp

    def engine_node_rank(self, rank: int) -> int | None:
        """SGLang's node_rank for `rank` if it starts its node's share of a multi-node engine (the engine's
        first rank on that node), else None. The owner is node 0 and the only one that serves requests."""
        engine = self.engine_of(rank)
        if engine is None:
            return None
        index = self.engine_ranks(engine).index(rank)
        per_node = self.engine_tp // self.engine_nnodes
        return index // per_node if index % per_node == 0 else None

    def owns_engine(self, rank: int) -> bool:
        engine = self.engine_of(rank)
        return engine is not None and self.engine_ranks(engine)[0] == rank

    def validate_for_model(self, shape: ModelShape) -> None:
        if shape.num_heads % self.engine_tp:
            raise LayoutError(
                f"rollout.engine_tp={self.engine_tp} does not divide the model's "
                f"{shape.num_heads} attention heads"
            )
        kv = shape.num_kv_heads
        if kv % self.engine_tp and self.engine_tp % kv:
            raise LayoutError(
                f"rollout.engine_tp={self.engine_tp} and the model's {kv} KV heads: one must divide "
                "the other (SGLang splits KV heads, or replicates them when engine_tp > KV heads)"
            )
