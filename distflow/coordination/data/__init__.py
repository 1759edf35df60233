"""Data half of the resharding coordinator: moves samples between DAG nodes whose layouts differ.

No driver: every rank all-gathers the small per-sample metadata (gather), computes the same plan
(plan_redistribution: who sends which sample to whom, balanced by tokens, local where possible), and
exchanges per-field buffers only with its peers (transport), on the DataCoordinator's background thread
(coordinator). The plan is pure and tested without processes.

Typical use on every rank of a DAG node's edge:
    coordinator = DataCoordinator()                       # collective, once
    edge = DataEdge("train_actor", PlacedLayout.rollout(placement), PlacedLayout.training(layout, placement),
                    FieldPlacement.standard("input_ids", "advantages", "loss_mask", "old_logprobs"))
    handle = coordinator.start(edge, my_rollout_batch)   # returns at once; runs on a background thread
    batch = handle.wait()                                # this rank's samples, sorted by sample id
    micro = handle.plan.micro_batches(rank, max_tokens=16384)
"""

from distflow.batch.packed import FieldSchema, PackedBatch
from distflow.coordination.data.balance import (
    balanced_assignment,
    balanced_partition,
    imbalance,
    largest_differencing,
    micro_batches,
)
from distflow.coordination.data.coordinator import (
    DataCoordinator,
    DataEdge,
    DataTransferTimeout,
    TransferHandle,
    double_buffered,
)
from distflow.coordination.data.gather import gather_sample_table
from distflow.coordination.data.layouts import STANDARD_FIELD_STAGES, FieldPlacement, PlacedLayout
from distflow.coordination.data.plan import (
    DataPlanError,
    RedistributionPlan,
    SampleTable,
    Transfer,
    is_identity,
    plan_redistribution,
)

__all__ = [
    "STANDARD_FIELD_STAGES",
    "DataCoordinator",
    "DataEdge",
    "DataPlanError",
    "DataTransferTimeout",
    "FieldPlacement",
    "FieldSchema",
    "PackedBatch",
    "PlacedLayout",
    "RedistributionPlan",
    "SampleTable",
    "Transfer",
    "TransferHandle",
    "balanced_assignment",
    "balanced_partition",
    "double_buffered",
    "gather_sample_table",
    "imbalance",
    "is_identity",
    "largest_differencing",
    "micro_batches",
    "plan_redistribution",
]
