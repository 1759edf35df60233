"""The two stages of one RL step: the rollout, and the training that consumes it.

The rollout stage is the nodes that run where the samples are generated (roles rollout and reward, and the
role-"all" nodes that work there, such as GRPO's outcome advantage) and need nothing the policy update
produces; the training stage is every other node (log-probs, updates, the weight sync). Lock-step runs the
two in turn; with rollout.max_staleness = k > 0 the rollout stage of step t + k runs while step t trains
(dag/lookahead.py), which is possible exactly because the rollout stage reads nothing of step t.
"""

from distflow.dag.graph import Pipeline

ROLLOUT_ROLES = ("rollout", "reward")


def rollout_stage(pipeline: Pipeline) -> tuple[str, ...]:
    """Ids of the rollout stage's nodes, in run order: a node of a rollout role, or a role-"all" node whose
    first produced input comes from the stage (it runs where that data is: dag/data_mover.py), whose every
    input is a source or an output of the stage."""
    producer_of = pipeline.producers()
    stage: list[str] = []
    for node in pipeline.validate():
        producers = [producer_of[name] for name in node.inputs if name in producer_of]
        if not all(p in stage for p in producers):
            continue
        if node.role in ROLLOUT_ROLES or (node.role == "all" and producers):
            stage.append(node.id)
    return tuple(stage)
