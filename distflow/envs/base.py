"""The environment contract: one object per trajectory, reset once, stepped after every model turn."""

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A call the model wrote: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Action:
    """One model turn as the environment sees it: its text (special tokens dropped) and the tool calls a
    parser found in it (empty: a plain answer)."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass
class StepResult:
    """What the environment answers a turn with.

    observation: text the policy reads before its next turn (a tool's output); it enters the trajectory as
    tokens the policy did not generate (loss mask 0). done: the trajectory ends here (observation unused).
    reward: an outcome reward from the environment (optional: the run's scorer decides otherwise).
    info: anything to keep with the sample (counted tool calls and errors go in `tool_calls`/`tool_errors`).
    """

    observation: str = ""
    done: bool = False
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Environment:
    """Subclass and override `step` (and `reset` when the trajectory needs state from its prompt's row).

    A new instance serves each trajectory, so state lives on `self`. `step` may block (a tool that runs
    code): the rollout runs it in a worker thread, bounded by rollout.env_timeout_s; an exception or a
    timeout ends that trajectory with a recorded reason, never the run.
    """

    def reset(self, sample: dict[str, Any]) -> None:
        """sample: the prompt's row (ground_truth, data_source, extra_info, prompt_index). The first
        observation is the prompt itself."""

    def step(self, action: Action) -> StepResult:
        raise NotImplementedError
