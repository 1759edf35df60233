"""A config's step simulated at several GPU counts and both controllers: the table rows, scaling efficiency
against the smallest GPU count, and the multi / single ratio.

Weak scaling (the default, Knobs.weak_scaling): the config describes the job at --world-size N; at G GPUs
the step has G/N times the prompts (data.train_batch_size, and actor/critic.mini_batch_size so the number
of updates per step stays), i.e. the same prompts per engine, as the paper's throughput runs scale.
"""

from dataclasses import dataclass, field
from typing import Callable, Optional

from distflow.config import ConfigError
from distflow.dag.graph import PipelineError
from distflow.layout import LayoutError
from distflow.plan.model_size import ModelArch
from distflow.plan.simulate.hardware_profile import Profile
from distflow.plan.simulate.step import CONTROLLERS, StepPrediction, simulate_step

DEFAULT_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)


def scaled_overrides(cfg, base_world: int, gpus: int) -> list[str]:
    """Overrides that give the config at `gpus` GPUs the prompts per GPU it has at base_world."""
    scale = gpus / base_world
    out = [f"data.train_batch_size={max(1, round(cfg.data.train_batch_size * scale))}"]
    for role in ("actor", "critic"):
        mini = getattr(cfg, role).mini_batch_size
        if mini:
            out.append(f"{role}.mini_batch_size={max(1, round(mini * scale))}")
    return out


@dataclass
class Row:
    gpus: int
    by_controller: dict[str, StepPrediction] = field(default_factory=dict)
    skipped: Optional[str] = None
    """Why this GPU count has no prediction (the layout does not fit it)."""

    def ratio(self) -> Optional[float]:
        """multi / single throughput."""
        m, s = self.by_controller.get("multi"), self.by_controller.get("single")
        return m.tokens_per_s / s.tokens_per_s if m and s and s.tokens_per_s else None


def sweep(
    config_at: Callable[[list[str]], object],
    base_cfg,
    base_world: int,
    arch: ModelArch,
    gpus: tuple[int, ...],
    profile: Profile,
    controllers: tuple[str, ...] = CONTROLLERS,
) -> list[Row]:
    """config_at(extra_overrides) resolves the user's config with extra overrides."""
    rows = []
    for g in gpus:
        row = Row(g)
        extra = scaled_overrides(base_cfg, base_world, g) if profile.knobs.weak_scaling else []
        try:
            cfg = config_at(extra)
            for c in controllers:
                row.by_controller[c] = simulate_step(cfg, arch, g, profile, c)
            if any(p.notes for p in row.by_controller.values()):
                # a plan that does not fit has no KV pool to speak of: its times mean nothing
                row.skipped = "; ".join(next(p.notes for p in row.by_controller.values() if p.notes))
                row.by_controller.clear()
        except (ConfigError, LayoutError, PipelineError, ValueError, AssertionError) as err:
            row.by_controller.clear()
            row.skipped = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        rows.append(row)
    return rows


def efficiency(rows: list[Row], controller: str) -> dict[int, float]:
    """Throughput per GPU at each G / that at the smallest simulated G."""
    done = [r for r in rows if controller in r.by_controller]
    if not done:
        return {}
    base = done[0].by_controller[controller].tokens_per_s / done[0].gpus
    return {r.gpus: r.by_controller[controller].tokens_per_s / r.gpus / base for r in done}
