"""Parallel layouts per role and the placement of training and rollout over ranks (pure, validated)."""

from distflow.layout.cluster import ClusterLayout
from distflow.layout.parallel import LayoutError, ParallelLayout, RankCoords
from distflow.layout.placement import Placement

__all__ = ["ClusterLayout", "LayoutError", "ParallelLayout", "Placement", "RankCoords"]
