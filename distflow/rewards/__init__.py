"""Rewards: rule-based scorers (gsm8k, gsm8k_verl, math, math_dapo, copy), custom scorers by dotted path, and
RewardPool, which scores batches in worker processes with a per-sample timeout. See registry.py for the scorer
contract."""

from distflow.rewards.pool import RewardPool, RewardSample
from distflow.rewards.registry import (
    BUILTIN_SCORERS,
    DATA_SOURCE_PREFIX_SCORERS,
    DATA_SOURCE_SCORERS,
    EXPECTED_SIGNATURE,
    Scorer,
    ScorerError,
    auto_scorer_name,
    load_scorer,
    scorer_path,
)

__all__ = [
    "RewardPool",
    "RewardSample",
    "BUILTIN_SCORERS",
    "DATA_SOURCE_PREFIX_SCORERS",
    "DATA_SOURCE_SCORERS",
    "EXPECTED_SIGNATURE",
    "Scorer",
    "ScorerError",
    "auto_scorer_name",
    "load_scorer",
    "scorer_path",
]
