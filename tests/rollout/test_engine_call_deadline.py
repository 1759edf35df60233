"""The engine call deadline (rollout.call_timeout_s): a call that waits on a stalled engine past its bound
raises EngineTimeoutError, and the engine counts as dead. Driven on a real event loop, as SGLang's calls are
(the death of a real engine's process is tested in test_sglang_engine.py). Also: a death reported as a call
ends does not stop the next engine's call on the same loop."""

import asyncio
import threading
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


def test_a_death_reported_as_a_call_ends_leaves_the_next_engines_calls_on_the_loop_alone():
    """The monitor stops the shared loop to end a waiting call; a death seen just as the call returned (the
    monitor's poll racing the call's own error) must not leave that stop queued for the restarted engine,
    whose weight sync would fail with 'Event loop stopped before Future completed'."""
    loop = asyncio.new_event_loop()
    old = EngineMonitor(old_engine := Engine(loop), [], log_path=None)
    new = EngineMonitor(new_engine := Engine(loop), [], log_path=None)

    def generate_then_die():
        result = loop.run_until_complete(asyncio.sleep(0, result="tokens"))
        old.mark_dead(
            "engine process 1 (sglang::scheduler) died"
        )  # the poll, after the loop ran, in the call
        return result

    try:
        assert old.call("generate", generate_then_die) == "tokens"
        with pytest.raises(EngineDiedError):
            old.call("generate", lambda: None)
        assert (
            new.call("update_weights_from_tensors", loop.run_until_complete, asyncio.sleep(0.05, result=3))
            == 3
        )
        with pytest.raises(EngineDiedError):  # a waiting call is still stopped by its own engine's death
            threading.Timer(0.2, new.mark_dead, args=("engine process 2 died",)).start()
            new.call("generate", loop.run_until_complete, asyncio.sleep(60))
    finally:
        del old_engine, new_engine
        loop.close()


def test_a_stop_in_the_iteration_that_completes_the_call_does_not_stop_the_next_run():
    """The monitor's stop and the step that completes the call's future can fall in one loop iteration: the
    call returns, and run_until_complete's done callback, left queued, would stop the loop's next run (and
    each later run that completes in its first iteration would pass it on)."""
    loop = asyncio.new_event_loop()
    old = EngineMonitor(old_engine := Engine(loop), [], log_path=None)
    new = EngineMonitor(new_engine := Engine(loop), [], log_path=None)

    async def generate():
        old.mark_dead("engine process 1 (sglang::scheduler) died")  # its stop is queued before our next step
        await asyncio.sleep(0)
        return "tokens"

    try:
        assert old.call("generate", loop.run_until_complete, generate()) == "tokens"
        assert loop.run_until_complete(asyncio.sleep(0, result=1)) == 1  # one that completes at once
        assert new.call("begin_weight_update", loop.run_until_complete, asyncio.sleep(0.05, result=3)) == 3
    finally:
        del old_engine, new_engine
        loop.close()


def test_the_tasks_a_call_leaves_when_the_engine_dies_under_it_are_kept_for_its_shutdown():
    """A call the monitor stops leaves its tasks pending on the shared loop (a chunked generation's run, its
    requests' streams); shutdown_engine cancels those it is given here, or garbage collection would later
    finalize their streams mid-await, each logging 'Task exception was never retrieved'."""
    loop = asyncio.new_event_loop()
    monitor = EngineMonitor(engine := Engine(loop), [], log_path=None)
    earlier = loop.create_task(asyncio.sleep(60))  # the engine's own, from before the call

    async def generate():
        streams = [asyncio.ensure_future(asyncio.sleep(60)) for _ in range(3)]
        await asyncio.wait(streams)

    try:
        threading.Timer(0.2, monitor.mark_dead, args=("engine process 1 died",)).start()
        with pytest.raises(EngineDiedError):
            monitor.call("generate", loop.run_until_complete, generate())
        assert len(monitor.orphaned_tasks) == 4 and earlier not in monitor.orphaned_tasks
        assert not any(task.done() for task in monitor.orphaned_tasks)
        for task in [*monitor.orphaned_tasks, earlier]:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*monitor.orphaned_tasks, earlier, return_exceptions=True))
    finally:
        del engine
        loop.close()
