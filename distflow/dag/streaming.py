"""rollout.stream_chunks: a lock-step step's samples reach the trainer while the engines still generate them.

In a disaggregated placement at max_staleness 0 the training ranks would idle through the whole generation
and only then run the old- and reference-log-prob passes, while the engine ranks idle in turn. Streamed,
the batch moves to the actor's layout in `stream_chunks` parts (coordination/data/streaming.py): an engine
owner sends its samples part by part, as they finish, from inside the generate node (the passes need
samples, not whole prompt groups, so a part need not wait for a group's longest response), and the training ranks,
which have nothing else to do before the hand-off, run the passes on each part as it arrives while the next
one moves and the engines generate. The last part moves with the hand-off as before; its passes run in the
log-prob nodes, which take the rest ready-made (nodes/logprob.py). The hand-off keeps every sample on the
data-parallel rank it reached early (DataEdge.placement), so nothing is computed twice.

Same samples, same models, the same passes, only earlier: the log-probs equal the unstreamed step's up to
float rounding in the forward's batch shapes. Every rank, training or not, walks the same parts in the same
order (the data coordinator's transfers are collective), so nothing is sent to agree on them.

Not at max_staleness > 0 (the rollout of step t + 1 already overlaps step t's training; its passes would
compete with that training on the training ranks), not colocated (one device does both in turn).
"""

import time
from typing import Optional

from distflow.coordination.data import DataCoordinator, DataEdge, FieldPlacement
from distflow.coordination.data.streaming import StreamedBatch
from distflow.dag.controller import RankController
from distflow.nodes import logprob

STREAMED_PASSES = {"old_logprob": "actor", "ref_logprob": "ref"}
"""The nodes whose work runs on the early parts, and the model each runs."""


class TrainingStream:
    """Streams each step's samples to the training ranks and runs their log-prob passes on arrival."""

    def __init__(self, controller: RankController, coordinator: DataCoordinator, parts: int):
        mover = controller.mover
        self.layout = mover.role_layouts["actor"]
        self.roles = streamed_roles(controller)
        # The hand-off's first move of the samples into this layout keys its plan by this node's keep_groups.
        consumer = next(
            n for n in controller.order if "samples" in n.inputs and mover.node_layouts[n.id] == self.layout
        )
        self.edge = DataEdge(
            node="stream_samples",
            producer=mover.node_layouts[controller.producer_of["samples"].id],
            consumer=self.layout,
            fields=FieldPlacement(mover.fields["samples"]),
            keep_groups=consumer.keep_groups,  # the hand-off's: its plan must key the placement alike
        )
        self.controller, self.coordinator, self.parts = controller, coordinator, parts

    @classmethod
    def build(
        cls, cfg, controller: RankController, coordinator: DataCoordinator
    ) -> Optional["TrainingStream"]:
        """The stream when the run has one: rollout.stream_chunks > 1, disaggregated, max_staleness 0, and
        a log-prob pass in the actor's layout to run early; else None (every rank decides alike)."""
        r = cfg.rollout
        if r.stream_chunks < 2 or r.placement != "disaggregated" or r.max_staleness > 0:
            return None
        return cls(controller, coordinator, r.stream_chunks) if streamed_roles(controller) else None

    def begin(self, ctx, record_span) -> StreamedBatch:
        """Opens step's stream on this rank (collective with every rank's begin): engine owners send from
        their generate node (ctx.samples_stream); training ranks receive the early parts and run the passes
        now, before the rollout stage; every other rank only takes part in the transfers."""
        stream = StreamedBatch(self.coordinator, self.edge, self.parts)
        ctx.samples_stream = stream
        if ctx.workers.rollout is None or not ctx.workers.rollout.owner:
            stream.close()
        if ctx.workers.actor is None:
            return stream
        ctx.step.streamed_logprobs = {role: {} for role in self.roles}
        for part in stream.received():
            arrived = time.time()
            try:
                for role in self.roles:
                    logprob.precompute(ctx, role, part)
            except Exception as exc:
                # Outside any node: the other ranks must hear of it as of a node's failure.
                self.controller.report("stream_logprobs", exc)
                raise
            record_span("stream_logprobs", arrived, time.time(), samples=0 if part is None else len(part))
        return stream


def streamed_roles(controller: RankController) -> tuple[str, ...]:
    """The models whose pass runs early: those of the pipeline's log-prob nodes in the actor's layout (a
    reference model in a layout of its own receives the samples whole, at the hand-off)."""
    mover = controller.mover
    actor = getattr(mover, "role_layouts", {}).get("actor")
    return tuple(
        role
        for node_id, role in STREAMED_PASSES.items()
        if any(n.id == node_id for n in controller.order)
        and actor is not None
        and mover.node_layouts.get(node_id) == actor
        and mover.node_layouts.get(controller.producer_of["samples"].id) != actor
    )
