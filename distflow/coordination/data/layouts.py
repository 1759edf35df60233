"""Where a DAG node's data lives: a ParallelLayout placed on global ranks, which rank holds each sample
(producers) and which ranks need it (consumers), and the field -> pipeline-stage rule.

Producer side: one rank per DP group holds and sends a sample: tp rank 0, cp rank 0, last pipeline stage
(for a rollout layout, the engine's owner rank). Consumer side: every TP and CP rank of the sample's DP
group gets it, but a pipeline stage gets only the fields it uses (FieldPlacement).
"""

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Mapping, Optional

from distflow.layout import LayoutError, ParallelLayout, Placement, RankCoords

Stage = Literal["first", "last", "all"]
STAGES = ("first", "last", "all")

# The RL batch fields DistFlow's nodes exchange, and the pipeline stages that read them: the first stage
# embeds tokens, the last computes losses and log-probs, every stage needs the attention layout.
STANDARD_FIELD_STAGES: dict[str, Stage] = {
    "input_ids": "first",
    "position_ids": "first",
    "attention_mask": "all",
    "labels": "last",
    "loss_mask": "last",
    "response_mask": "last",
    "advantages": "last",
    "returns": "last",
    "values": "last",
    "old_logprobs": "last",
    "ref_logprobs": "last",
    "rollout_logprobs": "last",
    "rewards": "last",
    "token_level_rewards": "last",
}


@dataclass(frozen=True)
class PlacedLayout:
    """A ParallelLayout over explicit global ranks (layout-local rank i is global rank ranks[i]).

    replicated: True when every rank of a DP group already holds that group's data for its own stage
    (Megatron nodes: all TP ranks of the last stage have the log-probs); False when only the holder does
    (SGLang engines: the owner rank). It decides whether "same layout" means "nothing to move".
    """

    layout: ParallelLayout
    ranks: tuple[int, ...] = ()
    replicated: bool = False

    def __post_init__(self):
        ranks = tuple(self.ranks) or tuple(range(self.layout.world_size))
        if len(ranks) != self.layout.world_size:
            raise LayoutError(
                f"layout {self.layout.describe()} covers {self.layout.world_size} ranks but "
                f"{len(ranks)} global ranks were given: {list(ranks)}"
            )
        if len(set(ranks)) != len(ranks) or min(ranks) < 0:
            raise LayoutError(f"global ranks {list(ranks)} must be distinct and >= 0")
        object.__setattr__(self, "ranks", ranks)

    @classmethod
    def rollout(cls, placement: Placement) -> "PlacedLayout":
        """A rollout layout: DP = number of engines, TP = engine_tp; each engine's owner holds its data."""
        layout = ParallelLayout(tp=placement.engine_tp, dp=placement.num_engines)
        return cls(layout, placement.rollout_ranks, replicated=False)

    @classmethod
    def training(cls, layout: ParallelLayout, placement: Placement) -> "PlacedLayout":
        return cls(layout, placement.train_ranks, replicated=True)

    @cached_property
    def _local(self) -> dict[int, int]:
        return {g: i for i, g in enumerate(self.ranks)}

    def same_ranks_as(self, other: "PlacedLayout") -> bool:
        return self.layout == other.layout and self.ranks == other.ranks

    def contains(self, rank: int) -> bool:
        return rank in self._local

    def coords(self, rank: int) -> Optional[RankCoords]:
        """Coordinates of a global rank, or None when the rank is not part of this layout."""
        local = self._local.get(rank)
        return None if local is None else self.layout.coords(local)

    def global_rank(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return self.ranks[self.layout.rank(tp, cp, dp, pp)]

    @cached_property
    def holders(self) -> tuple[int, ...]:
        """The global rank that holds DP group d's data, at index d (tp 0, cp 0, last stage)."""
        return tuple(self.global_rank(0, 0, d, self.layout.pp - 1) for d in range(self.layout.dp))

    @cached_property
    def holder_dp(self) -> dict[int, int]:
        return {rank: d for d, rank in enumerate(self.holders)}

    def dp_of(self, rank: int) -> Optional[int]:
        c = self.coords(rank)
        return None if c is None else c.dp

    def stage_of(self, rank: int) -> Optional[int]:
        c = self.coords(rank)
        return None if c is None else c.pp

    def dp_ranks(self, dp: int) -> tuple[int, ...]:
        """Every global rank of DP group `dp`, ordered by (pp, cp, tp)."""
        L = self.layout
        return tuple(
            self.global_rank(t, c, dp, p) for p in range(L.pp) for c in range(L.cp) for t in range(L.tp)
        )

    def describe(self) -> str:
        span = (
            f"ranks {self.ranks[0]}..{self.ranks[-1]}"
            if self.ranks == tuple(range(self.ranks[0], self.ranks[-1] + 1))
            else f"ranks {list(self.ranks)}"
        )
        return f"{self.layout.describe()} on {span}"


@dataclass(frozen=True)
class FieldPlacement:
    """Field name -> the pipeline stages of a consumer that read it: "first", "last" or "all".

    It is also the list of fields that move: a batch field without a rule is an error, never dropped
    silently, and every field with a rule must be present on every holder.
    """

    stages: Mapping[str, Stage] = field(default_factory=dict)

    def __post_init__(self):
        for name, stage in self.stages.items():
            if stage not in STAGES:
                raise ValueError(f"field {name!r}: stage {stage!r} is not one of {list(STAGES)}")
        object.__setattr__(self, "stages", dict(sorted(self.stages.items())))

    def __hash__(self):
        return hash(tuple(self.stages.items()))

    @classmethod
    def standard(cls, *names: str, **overrides: Stage) -> "FieldPlacement":
        """Rules for `names` from STANDARD_FIELD_STAGES, plus `overrides` (name=stage) for other fields."""
        unknown = [n for n in names if n not in STANDARD_FIELD_STAGES]
        if unknown:
            raise KeyError(
                f"no standard stage rule for fields {unknown}; known: {sorted(STANDARD_FIELD_STAGES)}"
                "; pass them as name='first'|'last'|'all'"
            )
        return cls({**{n: STANDARD_FIELD_STAGES[n] for n in names}, **overrides})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.stages)

    def used_on(self, name: str, stage: int, num_stages: int) -> bool:
        rule = self.stages[name]
        return (
            rule == "all" or (rule == "first" and stage == 0) or (rule == "last" and stage == num_stages - 1)
        )

    def fields_for_stage(self, stage: int, num_stages: int) -> tuple[str, ...]:
        return tuple(n for n in self.stages if self.used_on(n, stage, num_stages))
