"""ParallelLayout: one role's Megatron parallel layout, validated, and the rank <-> coordinate maps.

The rank order is Megatron-Core's default ("tp-cp-ep-dp-pp" for the dense part: tp fastest, pp slowest),
so coordinates computed here agree with megatron.core.parallel_state without creating any group; planners
(data and weight resharding) use these pure maps on every rank.
"""

from dataclasses import dataclass
from typing import Optional

from distflow.layout.model_shape import ModelShape


class LayoutError(ValueError):
    """A parallel layout that cannot work with the world size or the model; the message names the numbers."""


@dataclass(frozen=True)
class RankCoords:
    tp: int
    cp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class ParallelLayout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1

    @classmethod
    def for_world(
        cls, world_size: int, tp=1, pp=1, cp=1, vpp=1, ep=1, etp: Optional[int] = None, role: str = "actor"
    ) -> "ParallelLayout":
        """Derives dp = world / (tp * pp * cp) and checks that every size fits `world_size` ranks."""
        for name, value in (("tp", tp), ("pp", pp), ("cp", cp), ("vpp", vpp), ("ep", ep)):
            if value < 1:
                raise LayoutError(f"{role}.{name}={value} must be >= 1")
        etp = tp if etp is None else etp
        model_parallel = tp * pp * cp
        if world_size % model_parallel:
            raise LayoutError(
                f"{role}: world size {world_size} is not divisible by tp*pp*cp = {tp}*{pp}*{cp} = "
                f"{model_parallel}; use a world size that is a multiple of {model_parallel}"
            )
        if (world_size // pp) % (etp * ep):
            raise LayoutError(
                f"{role}: ranks per pipeline stage ({world_size}/{pp} = {world_size // pp}) are not "
                f"divisible by etp*ep = {etp}*{ep} = {etp * ep}"
            )
        if vpp > 1 and pp == 1:
            raise LayoutError(f"{role}.vpp={vpp} needs pipeline parallelism (pp > 1)")
        return cls(tp=tp, pp=pp, dp=world_size // model_parallel, cp=cp, vpp=vpp, ep=ep, etp=etp)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def validate_for_model(self, shape: ModelShape, role: str = "actor") -> None:
        """Heads and KV heads divisible by tp, layers by pp*vpp, experts by ep; errors name the numbers."""
        if shape.num_heads % self.tp:
            raise LayoutError(
                f"{role}.tp={self.tp} does not divide the model's {shape.num_heads} attention heads"
            )
        if shape.num_kv_heads % self.tp:
            raise LayoutError(
                f"{role}.tp={self.tp} does not divide the model's {shape.num_kv_heads} KV heads "
                f"(Megatron splits whole query groups over TP ranks)"
            )
        stages = self.pp * self.vpp
        if shape.num_layers % stages:
            raise LayoutError(
                f"{role}: {shape.num_layers} layers cannot be split evenly over pp*vpp = "
                f"{self.pp}*{self.vpp} = {stages} stages"
            )
        if self.ep > 1 and not shape.num_experts:
            raise LayoutError(f"{role}.ep={self.ep} but the model is dense (no experts)")
        if shape.num_experts and shape.num_experts % self.ep:
            raise LayoutError(f"{role}.ep={self.ep} does not divide the model's {shape.num_experts} experts")

    def coords(self, rank: int) -> RankCoords:
        """This layout's coordinates of a global rank (Megatron order: tp fastest, then cp, dp, pp)."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside a layout of {self.world_size} ranks")
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return RankCoords(tp=tp, cp=cp, dp=dp, pp=pp)

    def rank(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def tp_group(self, rank: int) -> list[int]:
        c = self.coords(rank)
        return [self.rank(t, c.cp, c.dp, c.pp) for t in range(self.tp)]

    def pp_group(self, rank: int) -> list[int]:
        c = self.coords(rank)
        return [self.rank(c.tp, c.cp, c.dp, p) for p in range(self.pp)]

    def dp_group(self, rank: int) -> list[int]:
        c = self.coords(rank)
        return [self.rank(c.tp, c.cp, d, c.pp) for d in range(self.dp)]

    def describe(self) -> str:
        text = f"tp={self.tp} pp={self.pp} dp={self.dp} cp={self.cp}"
        if self.vpp > 1:
            text += f" vpp={self.vpp}"
        if self.ep > 1 or self.etp != self.tp:
            text += f" ep={self.ep} etp={self.etp}"
        return text
