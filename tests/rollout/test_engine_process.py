"""The process hygiene around an engine start (distflow/workers/rollout/engine_process.py), without an engine:
output redirection into the engine's log, the caller's environment and root logger given back, the start-up
deadline killing only what the start spawned, and SIGQUIT only logged."""

import logging
import os
import subprocess
import sys
import time

import psutil

from distflow.workers.rollout import engine_process


def test_child_output_goes_to_the_log_and_the_callers_comes_back(tmp_path, capfd):
    log = engine_process.new_log_file(tmp_path / "logs" / "engine.log")
    assert log.parent.is_dir()
    with engine_process.output_to(log):
        subprocess.run(
            [sys.executable, "-c", "import sys; print('to-stdout'); print('to-stderr', file=sys.stderr)"],
            check=True,
        )
    os.write(1, b"after\n")
    assert log.read_text().split() == ["to-stdout", "to-stderr"]
    assert "after" in capfd.readouterr().out


def test_a_new_log_file_is_made_when_none_is_given():
    log = engine_process.new_log_file(None)
    try:
        assert log.is_file() and log.name.startswith("distflow-sglang-")
    finally:
        log.unlink()


def test_environment_and_root_logger_are_the_callers_again():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    os.environ.pop("DISTFLOW_TEST_ENGINE_VAR", None)
    with engine_process.restored_environ(), engine_process.restored_root_logger():
        os.environ["DISTFLOW_TEST_ENGINE_VAR"] = "set by the start"
        logging.basicConfig(force=True, level=logging.DEBUG)  # what SGLang does in the calling process
    assert "DISTFLOW_TEST_ENGINE_VAR" not in os.environ
    assert root.handlers == handlers and root.level == level


def test_startup_deadline_kills_only_the_processes_the_start_spawned():
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with engine_process.StartupGuard("tiny-model", timeout_s=1.0) as guard:
            tic = time.monotonic()
            hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            hung.wait(
                timeout=30
            )  # killed by the guard past its deadline (and reaped by psutil: no status here)
            assert time.monotonic() - tic < 30
        assert guard.timed_out and not psutil.pid_exists(hung.pid)
        assert "did not become ready within 1 s (startup_timeout_s)" in guard.describe_failure(TimeoutError())
        assert before.poll() is None  # started before the start began: left alone
    finally:
        before.kill()
        before.wait()


def test_a_start_within_its_deadline_kills_nothing():
    with engine_process.StartupGuard("tiny-model", timeout_s=30) as guard:
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait(timeout=30)
    time.sleep(0.1)
    assert not guard.timed_out
    message = guard.describe_failure(ValueError("bad dtype."))
    assert message == "SGLang engine for model 'tiny-model' failed: ValueError: bad dtype."


def test_sigquit_is_only_logged(caplog):
    with caplog.at_level(logging.ERROR, logger=engine_process.__name__):
        engine_process.on_engine_sigquit(3, None)
        with engine_process.StartupGuard("tiny-model", timeout_s=30):
            engine_process.on_engine_sigquit(3, None)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "SIGQUIT from an SGLang engine process",
        "an SGLang engine process failed during start-up",
    ]


def test_kill_waits_for_the_processes():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    engine_process.kill([psutil.Process(child.pid)], timeout_s=30)
    assert not psutil.pid_exists(child.pid)  # killed and reaped before kill returned
    child.wait(timeout=5)
