"""A scorer for the restart test: the copy task's reward, except that in the job's first attempt (torchrun's
TORCHELASTIC_RESTART_COUNT 0), once the checkpoint pointer named by DISTFLOW_TEST_KILL_AFTER says step_2,
it SIGKILLs the rank it scores for (its parent: the pool's workers are the rank's children), as the
kernel's OOM killer or a failing node would. torchrun --max-restarts then starts the job again."""

import os
import signal
from pathlib import Path

import psutil

from distflow.rewards import copy_task


def score(solution_str, ground_truth, extra_info=None, ended_with_eos=True):
    latest = Path(os.environ.get("DISTFLOW_TEST_KILL_AFTER", "/nonexistent"))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
    if first_attempt and latest.is_file() and latest.read_text().strip() == "step_2":
        psutil.Process().parent().send_signal(signal.SIGKILL)
    return copy_task.score(solution_str, ground_truth, ended_with_eos=ended_with_eos)
