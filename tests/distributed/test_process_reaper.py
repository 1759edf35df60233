"""What a failed attempt leaves running is killed by the next attempt's ranks, and nothing else is."""

import json
import subprocess
import sys
import time

from distflow.distributed import process_reaper


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def test_the_next_attempt_kills_what_the_last_one_listed_and_only_that(tmp_path):
    old_attempt = process_reaper.attempt_name({"slurm": 0, "torchrun": 0})
    new_attempt = process_reaper.attempt_name({"slurm": 0, "torchrun": 1})
    left_behind, ours = _sleeper(), _sleeper()
    try:
        recorder = process_reaper.DescendantRecorder(tmp_path, old_attempt, rank=1)
        recorder.path.parent.mkdir(parents=True)
        recorder.note_children()  # the failed attempt's rank listed both children of this process...
        listed = json.loads(recorder.path.read_text())
        assert {p["pid"] for p in listed} >= {left_behind.pid, ours.pid}
        # ...one of them is really this attempt's (same pid, other start time: a recycled pid), so it is spared
        for entry in listed:
            if entry["pid"] == ours.pid:
                entry["started"] -= 100
        recorder.path.write_text(json.dumps(listed))
        mine = process_reaper.DescendantRecorder(tmp_path, new_attempt, rank=1)
        mine.note_children()
        killed = process_reaper.reap_previous_attempts(tmp_path, new_attempt)
        assert any(f"({left_behind.pid})" in k for k in killed), killed
        left_behind.wait(timeout=10)  # gone (reaped by the reaper's wait: it is this process's child here)
        assert ours.poll() is None
        assert not recorder.path.exists() and mine.path.exists()  # this attempt's list stays
        assert process_reaper.reap_previous_attempts(tmp_path, new_attempt) == []
    finally:
        for proc in (left_behind, ours):
            proc.kill()
            proc.wait()


def test_the_recorder_keeps_the_list_current(tmp_path):
    process_reaper.REFRESH_S, refresh = 0.05, process_reaper.REFRESH_S
    child = None
    try:
        recorder = process_reaper.DescendantRecorder(tmp_path, "a", rank=0).start()
        child = _sleeper()
        deadline = time.monotonic() + 10
        while child.pid not in {p["pid"] for p in json.loads(recorder.path.read_text())}:
            assert time.monotonic() < deadline, "the new child was never listed"
            time.sleep(0.05)
        recorder.stop()
    finally:
        process_reaper.REFRESH_S = refresh
        if child is not None:
            child.kill()
            child.wait()
