"""run_python: each limit ends the code with its own status, refused operations are "blocked", and nothing of
the run (processes, scratch directory, parent environment) outlives it or leaks into it. Every test starts
real child interpreters and takes well under a second, except those that wait for a limit: one second of
wall clock, or one (two when SIGXCPU is ignored) of CPU time."""

import json
import os
import textwrap

import psutil
import pytest

from distflow.envs.python_sandbox import BLOCKED_MARKER, SandboxLimits, run_python


def run(code: str, **limits):
    return run_python(textwrap.dedent(code), SandboxLimits(**limits))


def assert_no_process_left():
    assert psutil.Process().children(recursive=True) == []


def test_print_and_exit_ok_with_stdin_and_output_captured():
    result = run_python(
        "import sys\nprint(input()[::-1])\nprint('to stderr', file=sys.stderr)", stdin="abc\n"
    )
    assert (result.status, result.exit_code) == ("ok", 0)
    assert result.stdout == "cba\n" and result.stderr == "to stderr\n"
    assert 0 < result.seconds < 10


def test_a_nonzero_exit_is_an_error_with_its_code():
    result = run("import sys\nsys.exit(3)")
    assert (result.status, result.exit_code) == ("error", 3)


def test_a_syntax_error_is_an_error_with_the_traceback_in_stderr():
    result = run("print('unclosed'\n")
    assert (result.status, result.exit_code) == ("error", 1)
    assert 'File "<sandbox>", line 1' in result.stderr
    assert "SyntaxError" in result.stderr


def test_a_runtime_error_shows_the_code_line_and_no_sandbox_frames():
    result = run("x = 1\ny = x / 0\n")
    assert result.status == "error"
    assert 'File "<sandbox>", line 2, in <module>' in result.stderr
    assert "y = x / 0" in result.stderr and result.stderr.rstrip().endswith(
        "ZeroDivisionError: division by zero"
    )
    assert "python_sandbox.py" not in result.stderr


def test_a_runaway_loop_hits_the_cpu_limit():
    result = run("while True: pass", cpu_seconds=1, wall_seconds=60)
    assert result.status == "cpu_limit", result
    assert result.exit_code < 0 and result.seconds < 30


def test_a_loop_that_ignores_sigxcpu_is_killed_at_the_hard_cpu_limit():
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass"
    result = run(code, cpu_seconds=1, wall_seconds=60)
    assert (result.status, result.exit_code) == ("cpu_limit", -9), result


def test_a_runaway_loop_hits_the_wall_clock_limit():
    result = run("while True: pass", cpu_seconds=60, wall_seconds=1)
    assert (result.status, result.exit_code) == ("timeout", None), result
    assert 1 <= result.seconds < 10
    assert_no_process_left()


def test_a_sleeping_child_times_out_with_the_output_it_printed():
    result = run("import time\nprint('before', flush=True)\ntime.sleep(60)", wall_seconds=1)
    assert result.status == "timeout" and result.stdout == "before\n"


def test_a_fork_bomb_is_blocked_and_leaves_no_process():
    result = run("import os\nwhile True: os.fork()")
    assert (result.status, result.exit_code) == ("blocked", 1), result
    assert f"PermissionError: {BLOCKED_MARKER} os.fork is not allowed" in result.stderr
    assert_no_process_left()


@pytest.mark.parametrize(
    "code",
    [
        'import subprocess\nsubprocess.run(["echo", "hi"])',
        'import os\nos.system("echo hi")',
        'import os\nos.execv("/bin/echo", ["echo", "hi"])',
        'import os\nos.posix_spawn("/bin/echo", ["echo", "hi"], {})',
        "import multiprocessing\nmultiprocessing.Process(target=print).start()",
        "import ctypes\nctypes.CDLL(None).fork()",
    ],
    ids=["subprocess", "os.system", "os.execv", "posix_spawn", "multiprocessing", "ctypes-fork"],
)
def test_starting_a_process_is_blocked(code):
    result = run(code)
    assert result.status == "blocked", result
    assert "hi" not in result.stdout
    assert_no_process_left()


def test_a_large_allocation_hits_the_memory_limit():
    result = run("x = bytearray(2 * 1024**3)", memory_mb=256)
    assert (result.status, result.exit_code) == ("memory_limit", 1), result
    assert result.stderr.rstrip().endswith("MemoryError")


def test_an_allocation_under_the_memory_limit_is_fine():
    result = run("x = bytearray(64 * 1024**2)\nprint(len(x))", memory_mb=256)
    assert (result.status, result.stdout) == ("ok", f"{64 * 1024**2}\n")


@pytest.mark.parametrize(
    "code",
    [
        'import socket\nsocket.create_connection(("127.0.0.1", 9))',
        'import urllib.request\nurllib.request.urlopen("http://example.com")',
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
        'import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect("/var/run/docker.sock")',
    ],
    ids=["create_connection", "urlopen", "udp-socket", "unix-connect"],
)
def test_the_network_is_blocked(code):
    result = run(code)
    assert result.status == "blocked", result
    assert "the sandbox has no network" in result.stderr


def test_asyncio_still_works_its_socketpair_is_local():
    result = run("import asyncio\nasyncio.run(asyncio.sleep(0))\nprint('done')")
    assert (result.status, result.stdout) == ("ok", "done\n"), result


def test_files_land_in_a_scratch_directory_that_is_gone_afterwards():
    code = """
        import json, os, tempfile
        with open("out.txt", "w") as file:
            file.write("data")
        with tempfile.NamedTemporaryFile(delete=False) as file:
            temporary = file.name
        print(json.dumps({"cwd": os.getcwd(), "file": os.path.abspath("out.txt"), "home": os.environ["HOME"],
                          "tmp": temporary, "listing": sorted(os.listdir("."))}))
    """
    result = run(code)
    assert result.status == "ok", result
    seen = json.loads(result.stdout)
    cwd = seen["cwd"]
    assert os.path.basename(cwd).startswith("distflow-sandbox-")
    assert seen["file"] == os.path.join(cwd, "out.txt")
    assert seen["home"] == cwd and seen["tmp"].startswith(cwd + os.sep)
    assert "out.txt" in seen["listing"] and not any(name.startswith(".distflow") for name in seen["listing"])
    assert not os.path.exists(cwd)


@pytest.mark.parametrize(
    "template",
    [
        "open({path!r}, 'w').write('x')",
        "import os\nos.makedirs({path!r})",
        "import os\nos.chdir('/')\nopen({path!r}[1:], 'w')",
        "import os\nos.symlink({path!r}, 'link')\nopen('link', 'w')",
    ],
    ids=["open", "makedirs", "relative-after-chdir", "through-a-symlink"],
)
def test_writing_outside_the_scratch_directory_is_blocked(tmp_path, template):
    target = tmp_path / "escaped"
    result = run(template.format(path=str(target)))
    assert result.status == "blocked", result
    assert "may change files only in its working directory" in result.stderr
    assert not target.exists()


def test_removing_a_file_outside_the_scratch_directory_is_blocked(tmp_path):
    victim = tmp_path / "checkpoint.pt"
    victim.write_text("weights")
    result = run(f"import os\nos.remove({str(victim)!r})")
    assert result.status == "blocked" and victim.read_text() == "weights"


def test_a_file_over_file_mb_fails():
    result = run("open('big', 'wb').write(b'x' * (2 * 1024**2))", file_mb=1)
    assert result.status == "error" and "File too large" in result.stderr, result


def test_output_over_output_bytes_is_truncated_with_a_marker():
    result = run(
        "import sys\nprint('a' * 100_000 + 'END')\nsys.stderr.write('e' * 50_000)", output_bytes=1000
    )
    assert result.status == "ok"
    assert result.stdout.startswith("a" * 500) and result.stdout.endswith("aEND\n")
    assert "[... 99004 bytes truncated by the sandbox ...]" in result.stdout
    assert len(result.stdout) < 1100 and len(result.stderr) < 1100
    assert "truncated by the sandbox" in result.stderr


def test_the_parent_environment_does_not_leak(monkeypatch):
    monkeypatch.setenv("DISTFLOW_SECRET", "1")
    result = run("import os, json\nprint(json.dumps(dict(os.environ)))")
    assert result.status == "ok"
    environment = json.loads(result.stdout)
    assert "DISTFLOW_SECRET" not in environment
    assert set(environment) == {"PATH", "LANG", "HOME", "TMPDIR"}


@pytest.mark.parametrize(
    "code",
    [
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
        "import os\nos.kill(os.getppid(), 0)",
    ],
    ids=["raise-rlimit", "signal-parent"],
)
def test_escaping_the_limits_is_blocked(code):
    assert run(code).status == "blocked"


def test_a_signal_that_ends_the_code_is_killed():
    result = run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert (result.status, result.exit_code) == ("killed", -15)


@pytest.mark.parametrize(
    "field", ["cpu_seconds", "wall_seconds", "memory_mb", "max_processes", "output_bytes", "file_mb"]
)
@pytest.mark.parametrize("value", [0, -1])
def test_bad_limits_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^SandboxLimits\.{field}={value} must be > 0"):
        SandboxLimits(**{field: value})


@pytest.mark.parametrize(
    "field, value", [("memory_mb", 1.5), ("cpu_seconds", float("inf")), ("file_mb", True)]
)
def test_limits_of_the_wrong_kind_raise(field, value):
    with pytest.raises(ValueError, match=rf"^SandboxLimits\.{field}="):
        SandboxLimits(**{field: value})
