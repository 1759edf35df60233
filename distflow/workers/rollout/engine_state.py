"""The weight version an engine serves, and whether its weights can be trusted (not half-updated).

Kept on the rank that owns the sglang.Engine object. A weight update marks the engine stale before it moves
the first byte and fresh (with the new version) only after the last byte is loaded and checked; an
interrupted update, or a dead engine process, leaves it stale, and `sglang_engine.generate` refuses to
sample from it until an update completes. Generations in flight on the engine (partial rollouts:
partial_generation) are interrupted when an update begins and continued with the new weights when it
completes; an update that fails leaves them interrupted.
"""

import weakref
from dataclasses import dataclass, field

_states: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class StaleEngineError(RuntimeError):
    """The engine's weights are not a complete, checked copy of any trained version."""


@dataclass
class EngineWeightState:
    version: int = 0
    """0: the weights the engine started with; n: the n-th completed sync."""
    stale_reason: str | None = None
    in_flight: list = field(default_factory=list)
    """partial_generation.InFlightGeneration objects with requests on the engine."""

    def begin_update(self, reason: str) -> None:
        """Before the first byte of an update: interrupts the generations in flight; stale until it completes."""
        for generation in list(self.in_flight):
            generation.interrupt()
        self.stale_reason = reason

    def complete_update(self, version: int | None) -> None:
        """After the last byte is loaded (and checked): fresh, serving `version` (None: unchanged); the
        interrupted generations continue with these weights."""
        self.stale_reason = None
        if version is not None:
            self.version = version
        for generation in list(self.in_flight):
            generation.resume()

    @property
    def fresh(self) -> bool:
        return self.stale_reason is None

    def require_fresh(self) -> None:
        if self.stale_reason is not None:
            raise StaleEngineError(
                f"the engine's weights are stale ({self.stale_reason}); it serves no complete "
                f"weight version until a weight sync succeeds (last good version: {self.version})"
            )


def state_of(engine) -> EngineWeightState:
    state = _states.get(engine)
    if state is None:
        state = _states[engine] = EngineWeightState()
    return state
