"""The workflow DAG every rank walks: graph definition, built-in pipelines, the per-rank controller."""

from distflow.dag.graph import Node, Pipeline, PipelineError

__all__ = ["Node", "Pipeline", "PipelineError"]
