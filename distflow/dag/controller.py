"""The per-rank controller: every rank walks the same DAG and runs the nodes of its roles.

There is no driver. A node runs on the ranks of its role; its inputs come from this rank's local store,
or from the data mover when the producing node ran in another layout (the mover is collective over the
ranks of both roles: ranks that do not compute a node still take part in moving its data). No barrier
separates nodes; a node waits only for the data it needs. Timing per node is recorded.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from distflow.dag.failure import FailureSignal
from distflow.dag.graph import Node, Pipeline, PipelineError


class SameLayoutMover:
    """The data mover for pipelines whose roles share one layout (colocated, same parallelism): the
    producer's local output is already where its consumer runs, so nothing moves."""

    def move(self, name: str, value: Any, producer: Node, consumer: Node) -> Any:
        return value


class SkipStep(Exception):
    """Raised by a node, on every rank alike, when this step has nothing left to do (the message says why)."""


class RolloutLost(SkipStep):
    """Raised by the generate node on the ranks of an engine that died under the rollout, with no live engine
    to take its prompts, when its restart cannot give the rollout back at once: the engine is restarted, the
    rest of the rollout stage does not run there, and the step that takes the rollout generates it again
    once every engine holds the actor's weights (dag/lookahead.py). Unlike SkipStep, only the engine's ranks
    raise it; the others hear of it when the rollout is taken."""


@dataclass
class StepResult:
    outputs: dict[str, Any]
    timing_s: dict[str, float] = field(default_factory=dict)
    skipped_at: str | None = None
    """The node that ended the step early with SkipStep (its later nodes did not run), else None."""
    spans: list[dict] = field(default_factory=list)
    """When each node ran: {"node", "start", "end"} in wall-clock seconds (time.time())."""
    skip: SkipStep | None = None
    """That SkipStep (a RolloutLost: the rollout is to be generated again, not skipped)."""


class RankController:
    def __init__(
        self,
        pipeline: Pipeline,
        ctx,
        rank: int,
        ranks_of_role: dict[str, tuple[int, ...]],
        mover=None,
        failure: FailureSignal | None = None,
    ):
        self.order = pipeline.validate(roles_with_ranks=[r for r, ranks in ranks_of_role.items() if ranks])
        self.pipeline, self.ctx, self.rank = pipeline, ctx, rank
        self.ranks_of_role = dict(ranks_of_role)
        self.mover = mover or SameLayoutMover()
        self.failure = failure
        self.producer_of = {out: pipeline.node(nid) for out, nid in pipeline.producers().items()}
        self._fns: dict[str, Callable] = {}

    def runs(self, node: Node) -> bool:
        return node.role == "all" or self.rank in self.ranks_of_role.get(node.role, ())

    def run_step(self, sources: dict[str, Any]) -> StepResult:
        """Runs one lock-step pass over the DAG. `sources` holds this rank's share of the source data."""
        self._new_step()
        return self.run_nodes(self.order, dict(sources))

    def run_nodes(self, nodes: list[Node], store: dict[str, Any]) -> StepResult:
        """Runs `nodes` (a part of `order`, in that order) on `store`, which holds their inputs from outside
        them; a node raising SkipStep ends the pass there."""
        store = dict(store)
        timing, skipped_at, skip, spans = {}, None, None, []
        for node in nodes:
            start, wall = time.perf_counter(), time.time()
            try:
                inputs = {node.arg(name): self._input(name, store, node) for name in node.inputs}
                if self.runs(node):
                    outputs = self._fn(node)(self.ctx, inputs)
                    self._check_outputs(node, outputs)
                    store.update(outputs)
            except SkipStep as exc:
                skipped_at, skip = node.id, exc
            except Exception as exc:
                self.report(node.id, exc)
                raise
            finally:
                timing[node.id] = time.perf_counter() - start
                spans.append({"node": node.id, "start": wall, "end": wall + timing[node.id]})
                if hasattr(
                    self.ctx, "take_spans"
                ):  # a NodeContext (tests drive the controller with stand-ins)
                    spans += self.ctx.take_spans()
            if skipped_at is not None:
                break
        return StepResult(outputs=store, timing_s=timing, skipped_at=skipped_at, skip=skip, spans=spans)

    def hand_off(self, store: dict[str, Any], nodes: list[Node]) -> None:
        """Starts a step whose `nodes` consume `store` (the outputs of the nodes run before them): every input
        of `nodes` from outside them moves now, in run order, to where its consumer runs (collective, like
        every move). run_nodes(nodes, store) then finds them moved. Asynchronous steps call it before
        generating ahead, so the training ranks get their data without waiting for that generation."""
        self._new_step()
        inside = {node.id for node in nodes}
        for node in nodes:
            for name in node.inputs:
                producer = self.producer_of.get(name)
                if producer is not None and producer.id not in inside:
                    try:
                        self._input(name, store, node)
                    except Exception as exc:
                        self.report(node.id, exc)
                        raise

    def _new_step(self) -> None:
        if hasattr(self.mover, "new_step"):
            self.mover.new_step()

    def report(self, node_id: str, exc: Exception) -> None:
        """Tells every rank that this one failed in `node_id` (they stop instead of waiting on it)."""
        if self.failure is not None:
            self.failure.report(node_id, exc)

    def _input(self, name: str, store: dict, consumer: Node) -> Any:
        producer = self.producer_of.get(name)
        if producer is None:  # a source: every rank holds its own share
            return store.get(name)
        return self.mover.move(name, store.get(name), producer, consumer)

    def _fn(self, node: Node) -> Callable:
        if node.id not in self._fns:
            self._fns[node.id] = node.resolve()
        return self._fns[node.id]

    @staticmethod
    def _check_outputs(node: Node, outputs) -> None:
        if not isinstance(outputs, dict) or set(outputs) != set(node.outputs):
            got = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
            raise PipelineError(
                f"node {node.id!r} must return a dict with keys {sorted(node.outputs)}, got {got}"
            )
