"""Which ranks take which DAG role, and how each role's layout reads, from a ClusterLayout."""

from distflow.layout import ClusterLayout


def ranks_of_role(cluster: ClusterLayout) -> dict[str, tuple[int, ...]]:
    p = cluster.placement
    return {
        "rollout": p.rollout_ranks,
        "reward": p.rollout_ranks,  # scored where the samples were generated
        "actor": p.train_ranks,
        "ref": p.train_ranks if cluster.ref else (),
        "critic": p.train_ranks if cluster.critic else (),
        "reward_model": p.train_ranks if cluster.reward_model else (),
        "all": tuple(range(p.world_size)),
    }


def describe_role(cluster: ClusterLayout, role: str) -> str:
    p = cluster.placement
    if role == "rollout":
        return f"{p.num_engines} engine(s) x engine TP {p.engine_tp}"
    if role == "reward":
        return "per sample, on the rollout ranks"
    if role == "all":
        return "every rank, on its local shard"
    layout = getattr(cluster, role)
    return layout.describe() if layout else "off"


def _span(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "none"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ",".join(map(str, ranks))


def describe_pipeline(pipeline, cluster: ClusterLayout) -> str:
    """One line per node in execution order: id, role, ranks, layout, data in and out."""
    order = pipeline.validate(roles_with_ranks=[r for r, ranks in ranks_of_role(cluster).items() if ranks])
    roles = ranks_of_role(cluster)
    lines = [f"pipeline {pipeline.name}: {len(order)} nodes, world size {cluster.placement.world_size}"]
    for i, node in enumerate(order, 1):
        lines.append(
            f"{i:2d}. {node.id:<17} role={node.role:<8} ranks={_span(roles[node.role]):<8} "
            f"layout: {describe_role(cluster, node.role)}"
        )
        lines.append(
            f"      {', '.join(node.inputs) or '-'} -> {', '.join(node.outputs)}"
            + ("   [keeps prompt groups whole]" if node.keep_groups else "")
        )
        if node.doc:
            lines.append(f"      {node.doc}")
    return "\n".join(lines)
