"""run_python: runs untrusted Python code (what a policy model writes in a tool-using rollout) in a child
interpreter with limits, and returns its output and how it ended.

What it guards against, the excesses and mistakes of model-written code:
- runaway loops (RLIMIT_CPU, and a wall-clock limit that kills the child's whole process group);
- huge allocations (RLIMIT_AS), huge files (RLIMIT_FSIZE), huge output (kept to its first and last bytes);
- fork bombs and subprocesses, network access, raising its own rlimits, signals to other processes and writes
  outside its scratch directory: an audit hook (sys.addaudithook) in the child refuses them with a
  PermissionError, plus RLIMIT_NPROC where it applies (not to root);
- leaked secrets and handles: a minimal environment, no inherited file descriptors, a fresh scratch directory
  as cwd, HOME and TMPDIR, deleted afterwards.

What it does NOT guard against: it is not a security boundary against a determined attacker. The audit hook
lives inside the interpreter it guards, so code that reaches C (ctypes beyond the few symbols refused here,
_posixsubprocess, a compiled extension) can get around it, and the code can read any file the user can. On a
cluster, run rollouts in a container or namespace with no network and a read-only filesystem; this module is
defence in depth inside it.

The child is `sys.executable -I -S -B` running this file: isolated (no PYTHON* variables, no user or script
directory on sys.path) and without site, so the code can import the standard library only.
"""

import builtins
import linecache
import math
import os
import re
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass, fields
from typing import Literal

BLOCKED_MARKER = "[distflow-sandbox]"
TRUNCATED = "[... {} bytes truncated by the sandbox ...]"
SandboxStatus = Literal["ok", "error", "timeout", "cpu_limit", "memory_limit", "killed", "blocked"]

_THIS_FILE = os.path.abspath(__file__)
_CODE_NAME = "<sandbox>"  # the file name tracebacks show for the code
_CODE_FILE = ".distflow_sandbox_code.py"  # in the scratch directory until the child has read it
_READ_CHUNK = 65536
_DRAIN_SECONDS = 2.0  # reading what a killed child left in its pipes
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITABLE_OUTSIDE = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})

# Audit events refused outright, with the reason the code is told.
_REFUSED = {
    **dict.fromkeys(
        ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen"),
        "the sandbox allows no new processes",
    ),
    **dict.fromkeys(
        (
            "socket.connect",
            "socket.bind",
            "socket.sendto",
            "socket.sendmsg",
            "socket.getaddrinfo",
            "socket.gethostbyname",
            "socket.gethostbyaddr",
            "socket.getnameinfo",
            "socket.sethostname",
        ),
        "the sandbox has no network",
    ),
    **dict.fromkeys(("resource.setrlimit", "resource.prlimit"), "the sandbox's resource limits are fixed"),
}
# C functions that would bypass the audit hook when called through ctypes.
_REFUSED_SYMBOLS = frozenset(
    {
        "fork", "vfork", "clone", "clone3", "system", "popen", "execv", "execve", "execvp", "execvpe",
        "execl", "execlp", "execle", "posix_spawn", "posix_spawnp", "socket", "connect", "bind",
        "setrlimit", "prlimit", "prlimit64", "kill", "killpg", "syscall",
    }
)  # fmt: skip
# Audit events that change the filesystem -> (path argument, its dir_fd argument or None) for each path they
# change; the layouts are CPython 3.11's.
_PATH_EVENTS = {
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)),
    "os.link": ((0, 2), (1, 3)),  # a hard link to an outside file would let the code write that file
    "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.utime": ((0, 3),),
    "os.truncate": ((0, None),),
    "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, 1),),
}


def _positive(value, integer: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return False
    return math.isfinite(value) and value > 0


@dataclass(frozen=True)
class SandboxLimits:
    """cpu_seconds: RLIMIT_CPU, rounded up to whole seconds (SIGXCPU, then SIGKILL a second later).
    wall_seconds: the child's process group is killed after this long.
    memory_mb: RLIMIT_AS, the address space (allocations past it raise MemoryError).
    max_processes: RLIMIT_NPROC, which counts every process and thread of the user, so the default means no
    new process or thread; the kernel does not apply it to root (the audit hook refuses forks regardless).
    output_bytes: stdout and stderr each keep their first and last output_bytes / 2 bytes.
    file_mb: RLIMIT_FSIZE, the largest file the code can write."""

    cpu_seconds: float = 5.0
    wall_seconds: float = 10.0
    memory_mb: int = 512
    max_processes: int = 1
    output_bytes: int = 16384
    file_mb: int = 16

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if not _positive(value, integer=field.type is int):
                kind = "an int" if field.type is int else "a finite number"
                raise ValueError(f"SandboxLimits.{field.name}={value!r} must be > 0 ({kind})")


@dataclass(frozen=True)
class SandboxResult:
    """exit_code: the child's exit status, minus the signal number when a signal ended it, None when the
    sandbox killed it at wall_seconds. seconds: wall-clock time of the whole run."""

    stdout: str
    stderr: str
    exit_code: int | None
    status: SandboxStatus
    seconds: float


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str = "") -> SandboxResult:
    """Runs `code` as a script in a sandboxed child interpreter fed `stdin`. Never raises for anything the
    code does; how it ended is the result's status."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="distflow-sandbox-", ignore_cleanup_errors=True) as scratch:
        scratch = os.path.realpath(scratch)
        with open(os.path.join(scratch, _CODE_FILE), "wb") as file:
            file.write(code.encode("utf-8", "replace"))
        child = subprocess.Popen(
            _child_command(scratch, limits),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            cwd=scratch,
            env=_child_environment(scratch),
            start_new_session=True,  # its own process group, so that everything it started can be killed
        )
        try:
            stdout, stderr, timed_out = _communicate(child, stdin.encode("utf-8", "replace"), start, limits)
        finally:
            # The child is not reaped yet, so its pid (the group's id) cannot have been reused.
            _kill_group(child.pid)
            wait_status, cpu_used = _reap(child)
    status = _classify(timed_out, wait_status, cpu_used, math.ceil(limits.cpu_seconds), stderr)
    exit_code = None if timed_out else os.waitstatus_to_exitcode(wait_status)
    return SandboxResult(stdout, stderr, exit_code, status, time.monotonic() - start)


def _child_command(scratch: str, limits: SandboxLimits) -> list[str]:
    cpu = math.ceil(limits.cpu_seconds)
    numbers = (cpu, cpu + 1, limits.memory_mb << 20, limits.file_mb << 20, limits.max_processes)
    # -X utf8: the code's text I/O is UTF-8 whatever locale the machine has.
    interpreter = [sys.executable, "-I", "-S", "-B", "-X", "utf8"]
    return [*interpreter, _THIS_FILE, scratch, *map(str, numbers)]


def _child_environment(scratch: str) -> dict[str, str]:
    # Built from nothing rather than filtered from os.environ: tokens and keys must not reach the code.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": scratch, "TMPDIR": scratch}


class _Capture:
    """One output stream, kept to its first and last bytes: the start says what the code was doing, the end
    holds the traceback."""

    def __init__(self, limit: int):
        self.head_limit, self.tail_limit = limit // 2, limit - limit // 2
        self.head, self.tail, self.dropped = bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        excess = len(self.tail) - self.tail_limit
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        head, tail = self.head.decode("utf-8", "replace"), self.tail.decode("utf-8", "replace")
        return f"{head}\n{TRUNCATED.format(self.dropped)}\n{tail}" if self.dropped else head + tail


def _communicate(child: subprocess.Popen, stdin: bytes, start: float, limits: SandboxLimits):
    """Feeds stdin and reads stdout/stderr until the child has exited or wall_seconds have passed (then
    kills its group). Returns (stdout, stderr, timed_out). Bounded memory, unlike Popen.communicate."""
    captures = {child.stdout: _Capture(limits.output_bytes), child.stderr: _Capture(limits.output_bytes)}
    deadline = start + limits.wall_seconds
    with selectors.DefaultSelector() as selector:
        for stream in captures:
            selector.register(stream, selectors.EVENT_READ)
        if stdin:
            os.set_blocking(child.stdin.fileno(), False)
            selector.register(child.stdin, selectors.EVENT_WRITE, memoryview(stdin))
        else:
            child.stdin.close()
        finished = _pump(selector, captures, deadline) and _wait_exit(child.pid, deadline)
        if not finished:
            _kill_group(child.pid)
            _pump(selector, captures, time.monotonic() + _DRAIN_SECONDS)
        for key in list(selector.get_map().values()):
            selector.unregister(key.fileobj)
            key.fileobj.close()
    return captures[child.stdout].text(), captures[child.stderr].text(), not finished


def _pump(selector: selectors.BaseSelector, captures: dict, deadline: float) -> bool:
    """Moves data until every pipe is closed (True) or the deadline passes (False)."""
    while selector.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        for key, _ in selector.select(remaining):
            if key.fileobj in captures:
                data = os.read(key.fd, _READ_CHUNK)
                if data:
                    captures[key.fileobj].add(data)
                    continue
            elif _write_stdin(selector, key):
                continue
            selector.unregister(key.fileobj)
            key.fileobj.close()
    return True


def _write_stdin(selector: selectors.BaseSelector, key: selectors.SelectorKey) -> bool:
    """Writes the next piece of stdin; False once all of it is written or the code stopped reading."""
    try:
        rest = key.data[os.write(key.fd, key.data) :]
    except BlockingIOError:
        return True
    except BrokenPipeError:
        return False
    if rest:
        selector.modify(key.fileobj, selectors.EVENT_WRITE, rest)
    return bool(rest)


def _wait_exit(pid: int, deadline: float) -> bool:
    """Whether the child exits before the deadline; leaves it unreaped (WNOWAIT). Its pipes are closed by
    now, which almost always means it is exiting, but the code may have closed them itself and run on."""
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is empty: the child alone was in it and has exited
        pass


def _reap(child: subprocess.Popen) -> tuple[int, float]:
    """Waits for the child; returns its wait status and the CPU seconds it used, which tell a SIGKILL at the
    hard RLIMIT_CPU from any other SIGKILL."""
    _, wait_status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(wait_status)  # reaped here, so Popen must not wait again
    for stream in (child.stdin, child.stdout, child.stderr):
        stream.close()
    return wait_status, usage.ru_utime + usage.ru_stime


def _classify(
    timed_out: bool, wait_status: int, cpu_used: float, cpu_limit: int, stderr: str
) -> SandboxStatus:
    if timed_out:
        return "timeout"
    if os.WIFSIGNALED(wait_status):
        signum = os.WTERMSIG(wait_status)
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_used >= cpu_limit):
            return "cpu_limit"
        return "killed"
    if os.WEXITSTATUS(wait_status) == 0:
        return "ok"
    # The last line of a traceback names the exception that ended the code; a refused operation may be
    # wrapped (urllib's URLError), but the hook's message is kept in it.
    last_line = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    if BLOCKED_MARKER in last_line:
        return "blocked"
    if re.match(r"MemoryError\b", last_line):
        return "memory_limit"
    return "error"


# The child side: this file runs as the child's script (see _child_command). Only the standard library here.


def _child_main(argv: list[str]) -> None:
    scratch = argv[0]
    cpu_soft, cpu_hard, memory, file_size, processes = map(int, argv[1:])
    code_path = os.path.join(scratch, _CODE_FILE)
    with open(code_path, "rb") as file:
        source = file.read().decode("utf-8", "replace")
    os.remove(code_path)
    _set_limit(resource.RLIMIT_CPU, cpu_soft, cpu_hard)
    _set_limit(resource.RLIMIT_AS, memory, memory)
    _set_limit(resource.RLIMIT_FSIZE, file_size, file_size)
    _set_limit(resource.RLIMIT_NPROC, processes, processes)
    _set_limit(resource.RLIMIT_CORE, 0, 0)  # SIGXCPU dumps core by default: slow, and a file in scratch
    # Set here rather than in Popen's preexec_fn, which can deadlock a parent that has threads (every
    # rollout worker has); the code cannot run before this point either way.
    _install_guard(scratch)
    sys.exit(_run_code(source))


def _set_limit(kind: int, soft: int, hard: int) -> None:
    # Only root may raise a hard limit: never ask for more than the current one.
    current = resource.getrlimit(kind)[1]
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(kind, (soft, hard))


def _install_guard(scratch: str) -> None:
    def guard(event: str, args: tuple) -> None:
        reason = _refusal(event, args, scratch)
        if reason is not None:
            raise PermissionError(f"{BLOCKED_MARKER} {event} is not allowed: {reason}")

    sys.addaudithook(guard)


def _refusal(event: str, args: tuple, scratch: str) -> str | None:
    """Why the sandbox refuses this audit event, or None. Runs on every event: cheap checks first."""
    if event in _REFUSED:
        return _REFUSED[event]
    if event == "socket.__new__" and args[1] != socket.AF_UNIX:
        # AF_UNIX stays: socket.socketpair (asyncio's event loop) needs it, and connect/bind are refused.
        return "the sandbox has no network"
    if event == "open" and isinstance(args[2], int) and args[2] & _WRITE_FLAGS:
        return _outside(args[0], None, scratch)
    if event in _PATH_EVENTS:
        for path_index, dir_fd_index in _PATH_EVENTS[event]:
            dir_fd = None if dir_fd_index is None else args[dir_fd_index]
            reason = _outside(args[path_index], dir_fd, scratch)
            if reason:
                return reason
        return None
    if event == "os.kill" and args[0] not in (0, os.getpid(), -os.getpgrp()):
        return "the code may signal only itself"
    if event == "os.killpg" and args[0] not in (0, os.getpgrp()):
        return "the code may signal only itself"
    if event in ("ctypes.dlsym", "ctypes.dlsym/handle") and args[1] in _REFUSED_SYMBOLS:
        return "the sandbox refuses C calls that would get around it"
    return None


def _outside(path, dir_fd, scratch: str) -> str | None:
    """The refusal for changing `path` when it resolves outside the scratch directory, else None."""
    if isinstance(path, int):  # an open file descriptor, checked when it was opened
        return None
    path = os.fsdecode(path)
    if path in _WRITABLE_OUTSIDE:
        return None
    if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
        path = os.path.join(f"/proc/self/fd/{dir_fd}", path)
    resolved = os.path.realpath(path)  # symlinks out of the scratch directory count as outside
    if resolved == scratch or resolved.startswith(scratch + os.sep):
        return None
    return f"the code may change files only in its working directory, not {resolved}"


def _run_code(source: str) -> int:
    """Runs the code as __main__ and returns the exit status; a traceback shows the code's frames only."""
    # No file on disk any more: linecache serves the traceback's source lines (mtime None: never checked).
    linecache.cache[_CODE_NAME] = (len(source), None, source.splitlines(True), _CODE_NAME)
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [_CODE_NAME]
    try:
        # dont_inherit: this file's compiler flags must not change how the code compiles.
        exec(compile(source, _CODE_NAME, "exec", dont_inherit=True), module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # the code's own failure, reported as Python would report it
        report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        _drop_sandbox_frames(report)
        sys.stderr.write("".join(report.format()))
        return 1
    return 0


def _drop_sandbox_frames(report: traceback.TracebackException | None) -> None:
    """Drops this file's frames (the runner, the audit hook) from a traceback and those chained to it: the
    code's author is shown its own code and the library calls it made."""
    if report is None:
        return
    report.stack = traceback.StackSummary.from_list(
        [frame for frame in report.stack if frame.filename != _THIS_FILE]
    )
    for chained in (report.__cause__, report.__context__, *(report.exceptions or ())):
        _drop_sandbox_frames(chained)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
