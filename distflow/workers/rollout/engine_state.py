"""The weight version an engine serves, and whether its weights can be trusted (not half-updated).

Kept on the rank that owns the sglang.Engine object. A weight update marks the engine stale before it moves
the first byte and fresh (with the new version) only after the last byte is loaded and checked; an
interrupted update, or a dead engine process, leaves it stale, and `sglang_engine.generate` refuses to
sample from it until an update completes.
"""

import weakref
from dataclasses import dataclass

_states: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class StaleEngineError(RuntimeError):
    """The engine's weights are not a complete, checked copy of any trained version."""


@dataclass
class EngineWeightState:
    version: int = 0
    """0: the weights the engine started with; n: the n-th completed sync."""
    stale_reason: str | None = None

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
