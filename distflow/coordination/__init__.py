"""Resharding coordinator: moves data between DAG nodes whose layouts differ (`data`), and trained weights
from Megatron shards into the rollout engines (weights). Both halves plan from the layout model in
distflow.layout, as pure functions computed identically on every rank, and execute separately."""
