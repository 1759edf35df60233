"""A scripted environment for tests of multi-turn rollouts through a whole run (rollout.env=
distflow.testing.echo_env:Echo): it answers every policy turn, so even a random policy makes
rollout.max_turns turns, and the trajectories carry environment tokens between them."""

from distflow.envs import Environment, StepResult


class Echo(Environment):
    def reset(self, sample):
        self.turn = 0

    def step(self, action):
        self.turn += 1
        return StepResult(f"seen {self.turn}: {action.text[:8]}", info={"tool_calls": 1, "tool_errors": 0})
