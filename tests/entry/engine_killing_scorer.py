"""A scorer for the failure-path test: on its KILL_AT-th call in the job it kills the SGLang scheduler of the
job it runs in (the engine holding rollouts generated ahead), then scores as the copy task does.

Calls are counted in the file named by DISTFLOW_TEST_KILL_COUNTER (the scorer runs in pool processes)."""

import os
from pathlib import Path

import psutil

from distflow.rewards import copy_task

KILL_AT = int(os.environ.get("DISTFLOW_TEST_KILL_AT", "0"))


def score(solution_str, ground_truth, extra_info=None, ended_with_eos=True):
    counter = Path(os.environ["DISTFLOW_TEST_KILL_COUNTER"])
    with counter.open("a") as f:
        f.write(".")
    if len(counter.read_text()) == KILL_AT:
        _kill_this_jobs_scheduler()
    return copy_task.score(solution_str, ground_truth, ended_with_eos=ended_with_eos)


def _kill_this_jobs_scheduler() -> None:
    """The torchrun agent above this process, then the scheduler among its descendants: never another job's."""
    agent = next(p for p in psutil.Process().parents() if "torch.distributed.run" in " ".join(p.cmdline()))
    for proc in agent.children(recursive=True):
        if "scheduler" in proc.name().lower() or "scheduler" in " ".join(proc.cmdline()).lower():
            proc.kill()
