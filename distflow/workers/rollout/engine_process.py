"""The process hygiene around an SGLang engine started inside a training process: what keeps a start-up or a
shutdown from hanging or killing the caller, and from leaving the caller's state changed.

- SIGQUIT: SGLang answers a dead child process with SIGQUIT to its parent, whose default handler kills the
  whole process tree (the caller included; rc 137 under a test runner). on_engine_sigquit (installed as
  SGLang's custom_sigquit_handler) and take_sigquit (the handler on the engine's event loop) only log it;
  the start itself, or engine_health's monitor afterwards, reports the failure;
- StartupGuard: a deadline on the start; past it the processes the start spawned are killed, so a hung
  start becomes an error; clean_up_failed_start ends what a failed start leaves behind;
- close_zmq_contexts: ZeroMQ contexts of a stopped engine closed without linger (else a hang at exit); kill:
  kills given processes and waits for them;
- restored_environ / restored_root_logger: the caller's os.environ and root logger back once the engine
  is up (SGLang changes both while it starts);
- new_log_file / output_to: the engine's processes write their stdout/stderr to a log file of their own.

Who calls: sglang_engine (start_engine, shutdown_engine) only.
"""

import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import types
from pathlib import Path

import psutil

from distflow.cpu_support import apply_environ

logger = logging.getLogger(__name__)


def new_log_file(log_path) -> Path:
    """The engine's log file: `log_path` (its directory created), or a new file in the temporary directory."""
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="distflow-sglang-", suffix=".log")
        os.close(fd)
        return Path(name)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return log_path


@contextlib.contextmanager
def output_to(log_path: Path):
    """Points this process's stdout and stderr (file descriptors 1 and 2) at `log_path` while the engine
    spawns its processes, which inherit them: their output lands in the log, the caller's stays its own."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)


def take_sigquit(engine) -> None:
    """SGLang installs, on the engine's event loop at its first request, a SIGQUIT handler that kills the
    caller's process tree; install it now and replace it with one that only logs (engine_health's monitor
    turns a death into an error). Signal handlers belong to the main thread; elsewhere SGLang installs
    none on the loop and the process handler (on_engine_sigquit) applies.

    SGLang also takes SIGTERM there, for a server's graceful shutdown, on the loop: a rank waiting in a
    collective (C code, the loop not running) then ignored SIGTERM until torchrun's SIGKILL 30 s later, its
    engine already gone and reported dead. SIGTERM gets back what it had before (by default: the rank ends
    at once, with the engine processes, which torchrun signals alike)."""
    if threading.current_thread() is not threading.main_thread():
        return
    manager = engine.tokenizer_manager
    sigterm = signal.getsignal(signal.SIGTERM)

    async def create_sglang_handle_loop():  # on the engine's loop: outside it SGLang would make a new one
        manager.auto_create_handle_loop()

    engine.loop.run_until_complete(create_sglang_handle_loop())
    engine.loop.add_signal_handler(signal.SIGQUIT, _log_sigquit)
    engine.loop.remove_signal_handler(signal.SIGTERM)
    signal.signal(signal.SIGTERM, sigterm)


def _log_sigquit():
    logger.error("SIGQUIT from an SGLang engine process (a child failed); its engine's monitor reports it")


def _zmq_contexts_in_traceback(tb) -> list:
    """The open ZeroMQ contexts that a traceback's frames hold in locals, directly or one attribute deep."""
    import zmq

    found = {}

    def consider(value):
        # type(), not isinstance: isinstance reads __class__, which lazy proxies may answer with side effects.
        if issubclass(type(value), zmq.Socket):
            value = value.context
        if issubclass(type(value), zmq.Context) and not value.closed:
            found[id(value)] = value

    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            consider(value)
            if not issubclass(type(value), (type, types.ModuleType)):
                try:  # the instance's own attributes, without running any __getattr__
                    attributes = object.__getattribute__(value, "__dict__")
                except (AttributeError, TypeError):
                    continue
                for attribute in list(attributes.values()):
                    consider(attribute)
        tb = tb.tb_next
    return list(found.values())


def close_zmq_contexts(*owners) -> None:
    """Closes the ZeroMQ contexts behind the owners' sockets without waiting on unsent messages.

    Otherwise garbage collection of the stopped engine destroys them with the sockets' default linger,
    which blocks forever once the peers are gone (seen as a hang at pytest's exit).
    """
    import zmq

    contexts = {
        id(v.context): v.context
        for owner in owners
        if owner is not None
        for v in vars(owner).values()
        if isinstance(v, zmq.Socket)
    }
    for context in contexts.values():
        context.destroy(linger=0)


# --- start-up protection -------------------------------------------------------------------------------

_starts_in_progress = 0
_start_lock = threading.Lock()


def on_engine_sigquit(signum, frame):
    """SIGQUIT handler for the engine's owner (SGLang's children send SIGQUIT when they fail).

    During a start the failure is reported by the start itself (SGLang notices the dead scheduler);
    afterwards by the engine's monitor (engine_health), which fails the calls on a dead engine. So the
    signal is only logged, and the caller (a trainer rank) lives on to report the error.
    """
    if _starts_in_progress:
        logger.error("an SGLang engine process failed during start-up (its log's tail follows the error)")
    else:
        logger.error(
            "SIGQUIT from an SGLang engine process (a child failed); its engine's monitor reports it"
        )


class StartupGuard:
    """Counts a start in progress and, past the deadline, kills the processes the start spawned.

    Killing them makes SGLang's wait for its schedulers fail within seconds, so a hung start (for example a
    scheduler blocked on a rendezvous) becomes an error. A hang in this process itself cannot be cut short.
    """

    def __init__(self, model_path: str, timeout_s: float):
        self.model_path, self.timeout_s = model_path, timeout_s
        self.timed_out = False
        self._me = psutil.Process()
        self._children_before = {p.pid for p in self._me.children(recursive=True)}
        self._done = threading.Event()

    def __enter__(self):
        global _starts_in_progress
        with _start_lock:
            _starts_in_progress += 1
        threading.Thread(target=self._watch, name="engine-startup-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc):
        global _starts_in_progress
        self._done.set()
        with _start_lock:
            _starts_in_progress -= 1

    def _watch(self):
        if not self._done.wait(self.timeout_s):
            self.timed_out = True
            logger.error(
                "SGLang engine for %s not ready after %.0f s; killing its processes",
                self.model_path,
                self.timeout_s,
            )
            self.kill_new_children()

    def kill_new_children(self):
        """Kills the processes spawned since the start began, except multiprocessing's shared helpers."""
        new = [p for p in self._me.children(recursive=True) if p.pid not in self._children_before]
        kill([p for p in new if not _is_multiprocessing_helper(p)], timeout_s=30)

    def clean_up_failed_start(self, exc: Exception):
        """Ends what a failed start leaves behind: its processes, and the ZeroMQ contexts its frames hold
        (the half-built tokenizer manager's), whose destruction at garbage collection would otherwise wait
        forever on the dead peers."""
        self.kill_new_children()
        for context in _zmq_contexts_in_traceback(exc.__traceback__):
            context.destroy(linger=0)

    def describe_failure(self, exc: Exception) -> str:
        what = (
            f"did not become ready within {self.timeout_s:.0f} s (startup_timeout_s)"
            if self.timed_out
            else f"failed: {type(exc).__name__}: {str(exc).rstrip('.')}"
        )
        return f"SGLang engine for model {self.model_path!r} {what}."


def _is_multiprocessing_helper(proc) -> bool:
    try:
        return any("resource_tracker" in part or "forkserver" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def kill(procs, timeout_s: float) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=timeout_s)


@contextlib.contextmanager
def restored_environ():
    """SGLang sets NCCL_*, CUDA_DEVICE_MAX_CONNECTIONS, ... in os.environ while it starts; its processes
    have inherited them by the end, and Megatron in this process must not see them."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        apply_environ(saved)


@contextlib.contextmanager
def restored_root_logger():
    """SGLang calls logging.basicConfig(force=True) in the calling process; give the caller its logging back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
