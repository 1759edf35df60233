"""Rollout on SGLang engines: one engine per rollout TP group, owned by the group's first rank."""

from distflow.workers.rollout.engine_health import EngineDiedError
from distflow.workers.rollout.engine_state import EngineWeightState, StaleEngineError, state_of
from distflow.workers.rollout.sglang_engine import (
    EngineCallError,
    EngineStartError,
    RolloutSample,
    generate,
    release_memory,
    resume_memory,
    shutdown_engine,
    start_engine,
    update_weights_from_disk,
    update_weights_from_tensors,
)

__all__ = [
    "EngineCallError",
    "EngineDiedError",
    "EngineStartError",
    "EngineWeightState",
    "RolloutSample",
    "StaleEngineError",
    "generate",
    "release_memory",
    "resume_memory",
    "shutdown_engine",
    "start_engine",
    "state_of",
    "update_weights_from_disk",
    "update_weights_from_tensors",
]
