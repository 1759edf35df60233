"""ClusterLayout: the placement plus every role's parallel layout, built and validated from the config.

Everything here is pure and runs in one CPU process for any world size (before any process group exists),
so a bad layout fails in a second with the numbers named, not after minutes of start-up on a cluster.
"""

from dataclasses import dataclass
from typing import Optional

from distflow.config.algorithm import uses_reference
from distflow.config.schema import DistFlowConfig
from distflow.layout.model_shape import ModelShape
from distflow.layout.parallel import LayoutError, ParallelLayout
from distflow.layout.placement import Placement


@dataclass(frozen=True)
class ClusterLayout:
    placement: Placement
    actor: ParallelLayout
    ref: Optional[ParallelLayout]
    critic: Optional[ParallelLayout]
    reward_model: Optional[ParallelLayout] = None
    """The reward model's layout (reward.model_path): the actor's, on the same ranks and Megatron groups."""

    @classmethod
    def from_config(
        cls, cfg: DistFlowConfig, world_size: int, shape: Optional[ModelShape]
    ) -> "ClusterLayout":
        r = cfg.rollout
        placement = Placement.create(r.placement, world_size, r.engine_tp, r.num_ranks, r.engine_nnodes)
        n_train = len(placement.train_ranks)
        layouts = {}
        for role, enabled in (("actor", True), ("ref", uses_reference(cfg)), ("critic", cfg.critic.enable)):
            layouts[role] = (
                ParallelLayout.for_world(n_train, **cfg.parallel_sizes(role), role=role) if enabled else None
            )
        for role in ("ref", "critic"):
            _require_actor_layout(role, layouts[role], layouts["actor"], getattr(cfg, role), cfg.actor)
        if shape is not None:
            placement.validate_for_model(shape)
            for role, layout in layouts.items():
                if layout is not None:
                    layout.validate_for_model(shape, role)
        reward_model = layouts["actor"] if cfg.reward.model_path else None
        return cls(placement=placement, reward_model=reward_model, **layouts)

    def describe(self) -> str:
        p = self.placement
        lines = [
            f"placement: {p.kind}, world size {p.world_size}, {len(p.train_ranks)} training ranks, "
            f"{p.num_engines} engine(s) of TP {p.engine_tp}"
        ]
        for e in range(p.num_engines):
            lines.append(f"  engine {e}: ranks {list(p.engine_ranks(e))}")
        for role in ("actor", "ref", "critic", "reward_model"):
            layout = getattr(self, role)
            lines.append(f"{role}: " + (layout.describe() if layout else "off"))
        return "\n".join(lines)


def _require_actor_layout(role: str, layout, actor, role_cfg, actor_cfg) -> None:
    """Megatron-Core keeps one set of process groups per process, built for the actor's layout, so the
    reference and the critic (on the same ranks) must use that layout too: their unset sizes are the actor's
    (DistFlowConfig.parallel_sizes), an explicit different one is an error naming it."""
    if layout is None or layout == actor:
        return
    fields = ("tp", "pp", "vpp", "cp", "ep", "etp")
    differ = [
        f"{role}.{f}={getattr(role_cfg, f)} (actor.{f}={getattr(actor_cfg, f)})"
        for f in fields
        if getattr(layout, f) != getattr(actor, f)
    ]
    raise LayoutError(
        f"{role} layout {layout.describe()} differs from the actor's {actor.describe()}: "
        f"{', '.join(differ)}; the {role} shares the actor's Megatron process groups, so set its "
        "parallel sizes to the actor's"
    )
