"""The dry-run planner: placement, layouts, per-GPU memory, data plan and weight-sync estimate of a run,
computed in one CPU process for any world size (`python -m distflow.plan`)."""

from distflow.plan.model_size import ModelArch
from distflow.plan.report import Plan, build_plan, render

__all__ = ["ModelArch", "Plan", "build_plan", "render"]
