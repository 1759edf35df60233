"""What the node functions of one rank share: the workers it holds, and the state of the step being run.

`NodeContext` is built once by the trainer. Its `workers` never change during a run; its `step` is replaced
at the start of every step, so a node cannot see another step's metrics. Everything else a node needs
arrives as its inputs (the DAG's data) or is read from the config.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # the types only: importing the workers here would start Megatron/SGLang imports
    from distflow.coordination.data.streaming import StreamedBatch
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
    """The frozen KL reference (distflow.config.algorithm.uses_reference)."""
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
    spans: list[dict] = field(default_factory=list)
    """Timeline rows a node adds beside its own (work it started that ran past it, e.g. streamed scoring)."""
    streamed_logprobs: dict[str, dict[int, tuple]] = field(default_factory=dict)
    """role -> {sample id: (log-probs, entropy) per token}: the passes a streamed step ran on the samples
    that reached this training rank while the engines generated (dag/streaming.py)."""
    lost_prompts: list | None = None
    """Dynamic sampling with training-only ranks: the prompts of this rank's generation round that died with
    its engine (nodes/rollout.generate_samples); every rank resyncs and they are generated again
    (nodes/dynamic_sampling.py)."""

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
    samples_stream: Optional["StreamedBatch"] = None
    """rollout.stream_chunks: the step's samples leaving for the training layout in parts while they are
    generated (dag/streaming.py); None when they move whole, after the rollout."""

    def record(self, **values) -> None:
        """Adds metrics to this step's (reduced over ranks by meaning: tracking/reduce.py)."""
        self.step.record(**values)

    def span(self, name: str, start: float, end: float, **extra) -> None:
        """Adds a row to this rank's timeline (wall-clock start and end, as time.time())."""
        self.step.spans.append({"node": name, "start": start, "end": end, **extra})

    def take_spans(self) -> list[dict]:
        """The rows added since the last call (the controller files them after each node)."""
        spans, self.step.spans = self.step.spans, []
        return spans
