"""The engine call deadline (rollout.call_timeout_s): a call that waits on a stalled engine past its bound
raises EngineTimeoutError, and the engine counts as dead. Driven on a real event loop, as SGLang's calls are
(the death of a real engine's process is tested in test_sglang_engine.py)."""

import asyncio
import time

import pytest

from distflow.workers.rollout.engine_health import EngineDiedError, EngineMonitor, EngineTimeoutError


class Engine:
    """What the monitor reads of an engine: its event loop (weakly referenced)."""

    def __init__(self, loop):
        self.loop = loop


@pytest.fixture
def stalled():
    """A monitor over an 'engine' whose calls never answer (no processes to watch: none dies)."""
    loop = asyncio.new_event_loop()
    monitor = EngineMonitor(engine := Engine(loop), [], log_path=None, call_timeout_s=0.5)
    yield monitor, loop
    del engine
    loop.close()


def test_a_call_past_its_deadline_raises_and_the_engine_serves_nothing_more(stalled):
    monitor, loop = stalled
    start = time.monotonic()
    with pytest.raises(
        EngineTimeoutError, match=r"generate did not finish within 0.5 s \(rollout.call_timeout_s"
    ):
        monitor.call("generate", loop.run_until_complete, asyncio.sleep(60))
    assert time.monotonic() - start < 10
    with pytest.raises(EngineTimeoutError):  # at once: it may still hold half-served requests
        monitor.call("update_weights_from_tensors", lambda: None)


def test_calls_within_the_deadline_are_untouched(stalled):
    monitor, loop = stalled
    for _ in range(3):  # the deadline is per call, not cumulative
        assert monitor.call("generate", loop.run_until_complete, asyncio.sleep(0.3, result=7)) == 7
    time.sleep(0.6)  # a finished call's timer does not fire later
    assert monitor.dead_reason is None
    assert issubclass(EngineTimeoutError, EngineDiedError)  # callers that stop on a death stop on this too
