"""Metrics tracking: console, JSONL, TensorBoard and W&B behind one Tracker (rank 0 only)."""

from distflow.tracking.tracker import METRIC_PREFIXES, Tracker, wandb_mode

__all__ = ["METRIC_PREFIXES", "Tracker", "wandb_mode"]
