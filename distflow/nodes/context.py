"""What the node functions of one rank share: the workers it holds, and the state of the step being run.

`NodeContext` is built once by the trainer. Its `workers` never change during a run; its `step` is replaced
at the start of every step, so a node cannot see another step's metrics. Everything else a node needs
arrives as its inputs (the DAG's data) or is read from the config.
"""
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch

from distflow.coordination.data import PackedBatch

if TYPE_CHECKING:  # the types only: importing the workers here would start Megatron/SGLang imports
    from distflow.data.loader import PromptLoader
    from distflow.nodes.sync import WeightSync
    from distflow.rewards.pool import RewardPool
    from distflow.workers.megatron.worker import MegatronWorker
    from distflow.workers.rollout.worker import RolloutWorker


@dataclass
class Workers:
    """The workers this rank holds; a role the rank has no share of is None."""
    rollout: Optional["RolloutWorker"] = None
    """Every rank has one (it owns an engine, hosts part of one, or only takes part in the syncs)."""
    actor: Optional["MegatronWorker"] = None
    """None on the rollout-only ranks of a disaggregated placement."""
    ref: Optional["MegatronWorker"] = None
    """The frozen KL reference (dag.builtin.uses_reference)."""
    critic: Optional["MegatronWorker"] = None
    """A value head, trained (pipelines with critic nodes)."""
    reward_model: Optional["MegatronWorker"] = None
    """reward.model_path: a forward-only scorer in the actor's layout."""
    reward_pool: Optional["RewardPool"] = None
    """Rule-based and custom scorers, on the ranks that hold samples (engine owners)."""

    def built(self) -> list[str]:
        """The Megatron roles this rank holds, for the start-up log."""
        return [r for r in ("actor", "ref", "critic", "reward_model") if getattr(self, r) is not None]


@dataclass
class StepState:
    """One step's state: its number and the metrics its nodes record (logged once, at the step's end)."""
    step: int
    metrics: dict[str, float] = field(default_factory=dict)

    def record(self, **values) -> None:
        self.metrics.update({k: float(v) for k, v in values.items()})


@dataclass
class NodeContext:
    """The `ctx` of `fn(ctx, inputs) -> outputs`: config, layouts, this rank, its workers, the step."""
    cfg: Any
    cluster: Any
    rank: int
    tokenizer: Any
    workers: Workers = field(default_factory=Workers)
    weight_sync: Optional["WeightSync"] = None
    """Moves the actor's weights into the engines (nodes/sync.py); built by the trainer, owns the resharder."""
    prompt_loader: Optional["PromptLoader"] = None
    """This rank's prompt stream (engine owners): dynamic sampling draws its extra rounds from it."""
    step: StepState = field(default_factory=lambda: StepState(0))

    def record(self, **values) -> None:
        """Adds metrics to this step's (reduced over ranks by meaning: tracking/reduce.py)."""
        self.step.record(**values)


def to_padded(batch: PackedBatch) -> dict[str, torch.Tensor]:
    """A PackedBatch as the Megatron worker's [B, S] right-padded tensors (sorted by sample id).

    Ragged fields become [B, S]; `attention_mask` is 1 on real tokens (those of input_ids, or of the first
    ragged field in a batch without input_ids, such as `from_padded`'s); fixed per-sample fields stay [B].
    """
    batch = batch.sorted_by_id()
    ragged = sorted(batch.row_counts, key=lambda name: name != "input_ids")
    lengths = batch.rows(ragged[0]) if ragged else torch.zeros(len(batch), dtype=torch.long)
    rows, width = len(batch), int(lengths.max()) if len(batch) else 0
    out = {"attention_mask": (torch.arange(width)[None, :] < lengths[:, None]).long()}
    for name, flat in batch.fields.items():
        if name in batch.row_counts:
            if not torch.equal(batch.row_counts[name], lengths):
                raise ValueError(f"ragged field {name!r} does not have one row per token of {ragged[0]!r}")
            padded = torch.zeros((rows, width), dtype=flat.dtype)
            padded[out["attention_mask"].bool()] = flat
            out[name] = padded
        else:
            out[name] = flat
    return out


def from_padded(samples: PackedBatch, padded: dict[str, torch.Tensor]) -> PackedBatch:
    """[B, S] tensors over `samples` in sample-id order (as `to_padded` gives them) -> a PackedBatch of
    token-level fields, one row per token of each sample (like input_ids), so they can move between layouts
    and come back with `to_padded`."""
    samples = samples.sorted_by_id()
    lengths = samples.rows("input_ids")
    width = max((t.shape[1] for t in padded.values()), default=0)
    real = torch.arange(width)[None, :] < lengths[:, None]
    fields = {name: t[real] for name, t in padded.items()}
    return PackedBatch(samples.sample_ids, samples.groups, samples.lengths, fields,
                       {name: lengths for name in fields})
