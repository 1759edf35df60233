"""Weights half of the resharding coordinator: trained Megatron shards -> SGLang engines' own shards.

plan_weight_sync (pure, identical on every rank) says, for every tensor every engine TP rank receives,
which training rank sends which region of which Megatron shard, in size-bounded buckets; WeightResharder
(resharder) executes it (each rank writes its own slices into the engine ranks' shared staging buffers:
staging, shared_memory_transport, or group_transport across nodes; the engine owner loads them with SGLang's
load_format="direct"), versions the engine's weights and verifies them (verification). A rank's failure
reaches every rank at the next exchange (rank_errors). megatron_tensors (megatron_names): a rank's
parameters under the plan's global names.
Shard layouts (sglang_layout, sglang_moe_layout): the dense families and the MoE ones (Mixtral, Qwen2-MoE,
Qwen3-MoE: fused w13/w2 expert tensors assembled from the experts' EP owners); the HF-named fallback
(hf_full_targets) serves the rest.

The trainer's sync node, on every rank (colocated placement):
    engine = start_engine(path, tp=engine_tp, extra_args=engine_side.engine_args())  # engine owners only
    resharder = WeightResharder.for_megatron_worker(actor, placement, cfg.sync, engine=engine)
    stats = resharder.sync()                   # collective; stats.version, stats.metrics() -> "sync/*"
    samples = sglang_engine.generate(engine, prompts, ...)   # refuses a stale engine; each sample carries
                                                             # the weight version it was sampled from
"""

from distflow.coordination.weights import engine_side
from distflow.coordination.weights.megatron_names import megatron_tensors
from distflow.coordination.weights.plan import HF, SHARDS, WeightSyncPlan, plan_weight_sync, sync_mode
from distflow.coordination.weights.rank_errors import WeightSyncError
from distflow.coordination.weights.resharder import SyncStats, WeightResharder
from distflow.coordination.weights.verification import WeightVerifyError
from distflow.workers.rollout.engine_health import EngineDiedError
from distflow.workers.rollout.engine_state import EngineWeightState, StaleEngineError, state_of

__all__ = [
    "HF",
    "SHARDS",
    "EngineDiedError",
    "EngineWeightState",
    "StaleEngineError",
    "SyncStats",
    "WeightResharder",
    "WeightSyncError",
    "WeightSyncPlan",
    "WeightVerifyError",
    "engine_side",
    "megatron_tensors",
    "plan_weight_sync",
    "state_of",
    "sync_mode",
]
