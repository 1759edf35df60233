"""Moves a DAG node's input from the layout its producer ran in to the layout its consumer runs in.

Roles map to data layouts: rollout and reward nodes hold samples on the engine owners (the rollout
layout); actor, ref, critic and reward_model nodes on their Megatron layouts (every TP rank of a DP replica holds the
replica's rows). Role "all" nodes work on data where it already is: they take the layout of their first
input's producer. When both layouts are the same, nothing moves (the local cache); otherwise the data
coordinator moves the PackedBatch, collectively, over the ranks of both layouts.
"""

import contextlib
from typing import Any

from distflow.coordination.data import DataCoordinator, DataEdge, FieldPlacement, PackedBatch, PlacedLayout
from distflow.coordination.data.stream_placement import StreamPlacement
from distflow.dag.graph import Node, Pipeline
from distflow.layout import ClusterLayout


class CoordinatorMover:
    def __init__(self, pipeline: Pipeline, cluster: ClusterLayout, coordinator: DataCoordinator):
        self.cluster, self.coordinator, self.fields = cluster, coordinator, pipeline.fields
        rollout = PlacedLayout.rollout(cluster.placement)
        self.role_layouts = {"rollout": rollout, "reward": rollout}
        for role in ("actor", "ref", "critic", "reward_model"):
            layout = getattr(cluster, role)
            if layout is not None:
                self.role_layouts[role] = PlacedLayout.training(layout, cluster.placement)
        self.node_layouts = self._node_layouts(pipeline, rollout)
        self._moved: dict[tuple[str, PlacedLayout], Any] = {}
        self._placements: dict[PlacedLayout, StreamPlacement] = {}

    @contextlib.contextmanager
    def placed(self, layout: PlacedLayout, placement: StreamPlacement):
        """Moves into `layout` keep the DP ranks `placement` gave the samples that went there early
        (dag/streaming.py), so each sample meets what was computed from it there."""
        self._placements[layout] = placement
        try:
            yield
        finally:
            del self._placements[layout]

    def _node_layouts(self, pipeline: Pipeline, default: PlacedLayout) -> dict[str, PlacedLayout]:
        producer_of = pipeline.producers()
        layouts = {}
        for node in pipeline.validate():
            if node.role != "all":
                layouts[node.id] = self.role_layouts[node.role]
            else:
                first = next((producer_of[i] for i in node.inputs if i in producer_of), None)
                layouts[node.id] = layouts[first] if first else default
        return layouts

    def new_step(self) -> None:
        self._moved.clear()

    def move(self, name: str, value: Any, producer: Node, consumer: Node) -> Any:
        src, dst = self.node_layouts[producer.id], self.node_layouts[consumer.id]
        if src.same_ranks_as(dst) and src.replicated == dst.replicated:
            return value
        key = (name, dst)
        if key not in self._moved:  # several consumers in one layout share one transfer
            if value is not None and not isinstance(value, PackedBatch):
                raise TypeError(
                    f"node {consumer.id!r}: input {name!r} must be a PackedBatch to move between "
                    f"layouts, got {type(value).__name__}"
                )
            if name not in self.fields:
                raise KeyError(
                    f"node {consumer.id!r}: input {name!r} moves from {src.describe()} to "
                    f"{dst.describe()} but the pipeline declares no fields for it (Pipeline.fields)"
                )
            fields = FieldPlacement(self.fields[name])
            edge = DataEdge(
                node=consumer.id,
                producer=src,
                consumer=dst,
                fields=fields,
                keep_groups=consumer.keep_groups,
                placement=self._placements.get(dst),
            )
            self._moved[key] = self.coordinator.transfer(edge, value)
        return self._moved[key]
