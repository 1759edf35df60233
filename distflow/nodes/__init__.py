"""The work a DAG node does on one rank: generate, score, advantages, log-probs, train, sync.

Each node function has the signature `fn(ctx: NodeContext, inputs: dict) -> dict` (see distflow.dag) and
records its metrics into ctx.metrics; the trainer logs them once per step.
"""
