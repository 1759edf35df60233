"""Environments for multi-turn, tool-using rollouts (rollout.env): what answers the policy between its turns.

An environment is a small class (base.Environment): `reset(sample)` once per trajectory with its prompt's
row, then `step(action)` after each model turn, answering with an observation (a tool's output, feedback)
or ending the trajectory. Built-in ones (builtin.py): `single_turn` (today's one response per prompt),
`calculator`, and `lookup` (the toy task that needs its tool). A user's is loaded by dotted path like a
custom reward (loading.py). Tool calls are parsed from the model's text by a parser of the chat template's
format (tool_parsers.py). The rollout loop itself is distflow/workers/rollout/multi_turn.py.
"""

from distflow.envs.base import Action, Environment, StepResult, ToolCall
from distflow.envs.loading import EnvError, load_environment

__all__ = ["Action", "EnvError", "Environment", "StepResult", "ToolCall", "load_environment"]
