"""Liveness of a running SGLang engine's processes, and engine calls that fail instead of hanging when one dies.

SGLang's engine object lives in the caller's process; its schedulers (one per engine TP rank) and its
detokenizer are child processes. A call (generate, a weight update) waits on them through ZeroMQ with no
timeout, so a dead child would make it wait forever; SGLang's own answer (a SIGQUIT to the caller, whose
handler kills the caller's whole process tree) takes the trainer down without saying why.

Here each engine gets an EngineMonitor (started by sglang_engine.start_engine): a daemon thread polls its
processes every `poll_s`; when one is gone it marks the engine dead and stale (engine_state), and if a call
is waiting it stops the engine's event loop, so the call raises EngineDiedError with the tail of the
engine's log, within about poll_s. Later calls raise EngineDiedError at once. SIGQUIT from SGLang's
children is only logged (the monitor decides).

A process that is alive but stuck (frozen, deadlocked, stopped) is caught by the call deadline instead:
with `call_timeout_s`, a call still waiting after that long stops the loop the same way, and the engine
counts as dead (EngineTimeoutError: it may still hold half-served requests, so nothing more is sent to it).
"""

import asyncio
import logging
import threading
import weakref
from pathlib import Path

import psutil

from distflow.workers.rollout.engine_state import state_of

logger = logging.getLogger(__name__)
_monitors: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
TAIL_LINES = 40


class EngineDiedError(RuntimeError):
    """A process of the SGLang engine died; the engine serves nothing more (restart it)."""


class EngineTimeoutError(EngineDiedError):
    """An engine call did not finish within its deadline (a stalled or frozen engine); the engine serves
    nothing more."""


def log_tail(path, lines: int = TAIL_LINES, max_bytes: int = 16384) -> str:
    """The last `lines` lines of the log at `path` (at most max_bytes), or a note why there are none."""
    if path is None:
        return "(no engine log captured)"
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"(engine log {path} unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or f"(engine log {path} is empty)"


def with_log_tail(message: str, path) -> str:
    return f"{message}\n--- last lines of the engine log {path} ---\n{log_tail(path)}\n--- end of the engine log ---"


class EngineMonitor:
    """Watches one engine's child processes (psutil.Process objects taken at start, so a reused pid is no
    false alarm). Call `call()` around every request that waits on the engine."""

    def __init__(self, engine, processes, log_path, poll_s: float = 0.5, call_timeout_s: float | None = None):
        self.processes, self.log_path, self.poll_s = list(processes), log_path, poll_s
        self.call_timeout_s = call_timeout_s
        """Deadline of every call (None: none); the rollout worker sets rollout.call_timeout_s."""
        self.loop = engine.loop
        self._engine = weakref.ref(engine)
        self.dead_reason: str | None = None
        self.timed_out = False
        self.in_call = False
        self._calls = 0
        """Calls begun; tells the call a stop was meant for from a later one."""
        self._stopped_call = 0
        self.orphaned_tasks: set = set()
        """Tasks a call left pending on the loop when the engine died under it (its requests' streams, a
        chunked generation's run): shutdown_engine cancels them, as it does the engine's own. Left alone they
        wait forever, and when garbage collection takes them their streams' finalizers log 'Task exception
        was never retrieved ... aclose(): asynchronous generator is already running', a screenful a death."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sglang-engine-monitor", daemon=True)

    def start(self) -> "EngineMonitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Before the engine is shut down on purpose."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.poll_s)

    def _dead_process(self) -> str | None:
        for proc in self.processes:
            try:
                alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                alive = False
            if not alive:
                return f"engine process {proc.pid} ({_name(proc)}) died"
        return None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            reason = self._dead_process()
            if reason is not None:
                self.mark_dead(reason)
                return

    def _record(self, reason: str) -> None:
        self.dead_reason = reason
        engine = self._engine()
        if engine is not None:
            state_of(engine).stale_reason = reason
        logger.error("SGLang engine: %s (log: %s)", reason, self.log_path)

    def check(self) -> bool:
        """Whether the engine is dead, looking at its processes now: a death since the last poll is
        recorded as the poll would have."""
        if self.dead_reason is None and (reason := self._dead_process()) is not None:
            self._record(reason)
        return self.dead_reason is not None

    def mark_dead(self, reason: str) -> None:
        self._record(reason)
        # A waiting call sees the loop stop (run_until_complete raises). Set after dead_reason, read after
        # in_call in call(): either the call sees the death first or the loop is stopped under it.
        if self.in_call:
            self.loop.call_soon_threadsafe(self._stop_call, self._calls)

    def _stop_call(self, call: int) -> None:
        """On the loop: stops it if call number `call` is still waiting. The loop is shared with the engine that
        replaces this one, so a stop must not outlive its call: queued while the call was ending, it would
        end the loop's next run (a restarted engine's first weight sync failed with 'Event loop stopped
        before Future completed')."""
        if self.in_call and self._calls == call:
            self._stopped_call = call
            self.loop.stop()

    def _run_out_stop(self) -> None:
        """After a call the monitor stopped: a stop run in the same iteration as the step that completed the
        call's future leaves run_until_complete's done callback queued, and that callback stops the loop's
        next run, which passes it on when it too completes in its first iteration. One iteration of the loop
        (stop, then run_forever) runs it out."""
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.stop()
            self.loop.run_forever()

    def error(self, what: str) -> EngineDiedError:
        kind = EngineTimeoutError if self.timed_out else EngineDiedError
        return kind(
            with_log_tail(
                f"SGLang engine: {self.dead_reason} (during or before {what}); it serves nothing more",
                self.log_path,
            )
        )

    def _time_out(self, what: str) -> None:
        if self.dead_reason is None:
            self.timed_out = True
            self.mark_dead(
                f"{what} did not finish within {self.call_timeout_s:g} s (rollout.call_timeout_s, default "
                "trainer.dist_timeout_s): the engine is stalled or frozen, or the call needs a longer bound"
            )

    def call(self, what: str, fn, *args, **kwargs):
        """fn(*args, **kwargs); raises EngineDiedError (with the log tail) if the engine is or becomes dead,
        EngineTimeoutError if it runs past call_timeout_s."""
        self._calls += 1
        number = self._calls
        self.in_call = True
        deadline = None
        if self.call_timeout_s is not None:
            deadline = threading.Timer(self.call_timeout_s, self._time_out, args=(what,))
            deadline.daemon = True
            deadline.start()
        try:
            if self.dead_reason is not None:
                raise self.error(what)
            before = asyncio.all_tasks(self.loop)
            return fn(*args, **kwargs)
        except EngineDiedError:
            raise
        except BaseException as exc:
            if self.check():  # also a death since the last poll
                self.orphaned_tasks |= asyncio.all_tasks(self.loop) - before
                raise self.error(what) from exc
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
            self.in_call = False
            if self._stopped_call == number:
                self._run_out_stop()


def _name(proc) -> str:
    try:
        return proc.name()
    except Exception:  # noqa: BLE001 - a dead process may have no name left
        return "?"


def watch(engine, log_path, poll_s: float = 0.5, call_timeout_s: float | None = None) -> EngineMonitor:
    """Starts monitoring `engine`'s child processes (sglang_engine.start_engine calls this); call_timeout_s
    bounds every call (None: unbounded)."""
    processes = []
    for pid in engine.get_all_child_pids():
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            raise EngineDiedError(
                with_log_tail(f"SGLang engine process {pid} died during start-up", log_path)
            )
    monitor = _monitors[engine] = EngineMonitor(engine, processes, log_path, poll_s, call_timeout_s).start()
    return monitor


def monitor_of(engine) -> EngineMonitor | None:
    return _monitors.get(engine)


def call(engine, what: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) guarded by the engine's monitor (unguarded for an engine without one)."""
    monitor = _monitors.get(engine)
    if monitor is None:
        return fn(*args, **kwargs)
    return monitor.call(what, fn, *args, **kwargs)


def is_dead(engine) -> bool:
    monitor = _monitors.get(engine)
    return monitor is not None and monitor.dead_reason is not None


def check_now(engine) -> bool:
    """Whether the engine is dead, looking at its processes now (a death since the last poll is recorded)."""
    monitor = _monitors.get(engine)
    return monitor is not None and monitor.check()


def log_path_of(engine) -> Path | None:
    monitor = _monitors.get(engine)
    return None if monitor is None else monitor.log_path
