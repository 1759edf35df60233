"""The work a DAG node does on one rank: generate, score, advantages, log-probs, train, sync.

Each node function has the signature `fn(ctx: NodeContext, inputs: dict) -> dict` (see distflow.dag): it
reads the rank's workers from ctx.workers, the step number from ctx.step, and records its metrics with
ctx.record; the trainer logs them once per step. Work that a caller repeats within a step (dynamic
sampling's extra rounds, validation) is a plain function returning (outputs, metrics) beside the node.
"""
