"""The workflow DAG: nodes (id, role, function, inputs, outputs) and its validation.

A Pipeline is data: every rank builds the same one and walks it with its own controller
(distflow.dag.controller). Edges are implied by data: a node depends on the nodes that produce its
inputs. Validation runs before any process group exists and names the offending node.
"""

from dataclasses import dataclass, field
from typing import Callable, Iterable

from distflow.config.dotted_path import load_callable

# Roles a node can run on. "all" nodes run on every rank (cheap per-sample work such as advantages).
ROLES = ("rollout", "reward", "actor", "ref", "critic", "reward_model", "all")


class PipelineError(ValueError):
    """A pipeline that cannot run: a cycle, an input nobody produces, a role without ranks, a bad function."""


@dataclass(frozen=True)
class Node:
    id: str
    role: str
    fn: str | Callable
    """`fn(ctx, inputs: dict) -> dict` with exactly `outputs` as keys; a callable or 'module:function'."""
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    keep_groups: bool = False
    """The node needs every sample of a prompt's group on the same rank (advantages, dynamic sampling)."""
    doc: str = ""
    arg_names: tuple[tuple[str, str], ...] = ()
    """(data name, key) pairs: the function receives that input under another key, so one node function
    serves renamed data (DAPO's advantage/log-prob/train nodes read kept_samples as "samples")."""

    def arg(self, data_name: str) -> str:
        """The key under which the function receives input `data_name`."""
        return dict(self.arg_names).get(data_name, data_name)

    def resolve(self) -> Callable:
        if callable(self.fn):
            return self.fn
        try:
            return load_callable(self.fn, f"node {self.id!r}: cannot load its function {self.fn!r}")
        except ValueError as err:
            raise PipelineError(str(err)) from None


@dataclass
class Pipeline:
    name: str
    nodes: list[Node] = field(default_factory=list)
    sources: tuple[str, ...] = ("prompts",)
    """Data that exists before the first node: the step's prompt batch, read by each rank from its shard."""
    fields: dict[str, dict[str, str]] = field(default_factory=dict)
    """Data name -> {field: "first" | "last" | "all"}: the fields of a PackedBatch that may move between
    layouts and the pipeline stages that read each (declared, because every rank plans the move,
    including ranks that hold none of the data)."""

    def add(
        self,
        id: str,
        role: str,
        fn,
        inputs: Iterable[str] = (),
        outputs: Iterable[str] = (),
        keep_groups: bool = False,
        doc: str = "",
        arg_names: dict[str, str] | None = None,
    ) -> "Pipeline":
        self.nodes.append(
            Node(
                id,
                role,
                fn,
                tuple(inputs),
                tuple(outputs),
                keep_groups,
                doc,
                tuple(sorted((arg_names or {}).items())),
            )
        )
        return self

    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def producers(self) -> dict[str, str]:
        """Data name -> id of the node that produces it."""
        return {out: n.id for n in self.nodes for out in n.outputs}

    def validate(self, roles_with_ranks: Iterable[str] | None = None) -> list[Node]:
        """Checks the graph; returns the nodes in an execution (topological) order.

        roles_with_ranks: roles the job has ranks for (from the ClusterLayout); None skips that check.
        """
        seen, produced_by = set(), {}
        for n in self.nodes:
            if n.id in seen:
                raise PipelineError(f"pipeline {self.name!r}: two nodes are named {n.id!r}")
            seen.add(n.id)
            if n.role not in ROLES:
                raise PipelineError(f"node {n.id!r}: role {n.role!r} is not one of {list(ROLES)}")
            for out in n.outputs:
                if out in produced_by or out in self.sources:
                    first = produced_by.get(out, "the pipeline's sources")
                    raise PipelineError(f"node {n.id!r}: output {out!r} is already produced by {first}")
                produced_by[out] = n.id
        for n in self.nodes:
            for data_name, _ in n.arg_names:
                if data_name not in n.inputs:
                    raise PipelineError(
                        f"node {n.id!r}: arg_names renames {data_name!r}, which is not one of its "
                        f"inputs {list(n.inputs)}"
                    )
            for name in n.inputs:
                if name not in produced_by and name not in self.sources:
                    raise PipelineError(
                        f"node {n.id!r}: input {name!r} is produced by no node "
                        f"(outputs: {sorted(produced_by)}; sources: {list(self.sources)})"
                    )
        if roles_with_ranks is not None:
            available = set(roles_with_ranks) | {"all"}
            for n in self.nodes:
                if n.role not in available:
                    raise PipelineError(
                        f"node {n.id!r} runs on role {n.role!r}, which has no ranks in this job "
                        f"(roles with ranks: {sorted(available)})"
                    )
        return self._topological_order(produced_by)

    def _topological_order(self, produced_by: dict[str, str]) -> list[Node]:
        deps = {n.id: {produced_by[i] for i in n.inputs if i in produced_by} for n in self.nodes}
        order, done, visiting = [], set(), []

        def visit(node_id):
            if node_id in done:
                return
            if node_id in visiting:
                cycle = visiting[visiting.index(node_id) :] + [node_id]
                raise PipelineError(f"pipeline {self.name!r} has a cycle: {' -> '.join(cycle)}")
            visiting.append(node_id)
            for dep in sorted(deps[node_id], key=self._position):
                visit(dep)
            visiting.pop()
            done.add(node_id)
            order.append(self.node(node_id))

        for n in self.nodes:  # declaration order breaks ties: the order the author wrote is kept
            visit(n.id)
        return order

    def _position(self, node_id: str) -> int:
        return [n.id for n in self.nodes].index(node_id)
