"""Training data: prompt parquet files in the common RL schema (prompts.py) and per-rank batches (loader.py)."""

from distflow.data.loader import PromptLoader, epoch_order, val_batches
from distflow.data.prompts import DataError, Prompt, PromptDataset

__all__ = ["PromptLoader", "epoch_order", "val_batches", "DataError", "Prompt", "PromptDataset"]
