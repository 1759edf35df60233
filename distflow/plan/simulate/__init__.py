"""A calibrated cost model of one RL step at many GPU counts, multi- vs single-controller: the dry-run
planner's `--simulate` (docs/scaling.md)."""

from distflow.plan.simulate.hardware_profile import Knobs, Profile, load_profile
from distflow.plan.simulate.step import StepPrediction, simulate_step
from distflow.plan.simulate.sweep import sweep

__all__ = ["Knobs", "Profile", "StepPrediction", "load_profile", "simulate_step", "sweep"]
