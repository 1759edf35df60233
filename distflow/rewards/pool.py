"""RewardPool: scores a batch of responses in worker processes, with a per-sample timeout.

Every rollout rank owns one pool and scores its own samples (no central reward process). A scorer that
raises, returns garbage, crashes its worker or runs past `timeout_s` gives that sample 0.0 and is counted
(reward/errors, reward/timeouts); the worker is replaced and the batch goes on. Nothing a scorer does can
stop the run. `num_workers=0` scores in the calling process instead (for debugging: no timeout there).
Hand-written rather than pebble's ProcessPool (judged for issue #12): pebble schedules into multiprocessing
workers, and spawn/forkserver workers re-import the trainer's __main__ (torch: seconds and hundreds of MB per
worker, again at every respawn after a timeout) while fork is unsafe beside CUDA/NCCL threads; these workers
are plain interpreters (_worker.py). tests/rewards/test_reward_pool.py checks that they never import torch.
"""

import logging
import math
import subprocess
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import wait
from typing import Any, Mapping

from distflow.rewards.registry import BUILTIN_SCORERS, load_scorer, scorer_path

logger = logging.getLogger(__name__)
_STARTUP_TIMEOUT_S = 120.0  # a worker that cannot even start (import) in this long is broken


@dataclass
class RewardSample:
    """One response to score. `response` is the generated text decoded without special tokens;
    `ended_with_eos` is true when generation stopped at the EOS token (false: cut at max_new_tokens)."""

    response: str
    ground_truth: Any
    data_source: str
    ended_with_eos: bool
    extra_info: dict | None = None


class RewardPool:
    """Rule-based / custom scoring of responses. Build with `from_config(cfg.reward)` or directly:

    name: a built-in scorer (registry.BUILTIN_SCORERS: "gsm8k", "gsm8k_verl", "math", "math_dapo", ...) or "auto"
    (chosen per sample from its data_source); custom: "module:function" used for every sample instead (checked
    now, in this process, against the scorer contract in registry.py).
    """

    def __init__(
        self, name: str = "gsm8k", custom: str | None = None, num_workers: int = 2, timeout_s: float = 10.0
    ):
        if num_workers < 0 or timeout_s <= 0:
            raise ValueError(
                f"RewardPool needs num_workers >= 0 and timeout_s > 0 (got {num_workers}, {timeout_s})"
            )
        self.name, self.custom, self.num_workers, self.timeout_s = name, custom, num_workers, timeout_s
        if custom:
            self._preload = [custom]
        elif name == "auto":
            self._preload = sorted(set(BUILTIN_SCORERS.values()))
        else:
            self._preload = [scorer_path(name, None, "")]
        for path in self._preload:
            load_scorer(path)  # fail now, with the signature message, rather than per sample later
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        self.last_errors: list[tuple[int, str]] = []  # (sample index, message) of the latest batch

    @classmethod
    def from_config(cls, cfg) -> "RewardPool":
        """From a RewardConfig (reward.name, reward.custom, reward.num_workers, reward.timeout_s).
        reward.model_path is not the pool's: the reward model scores training samples in a DAG node
        (distflow.nodes.reward.model_score); the pool still scores validation answers by reward.name."""
        return cls(cfg.name, cfg.custom, cfg.num_workers, cfg.timeout_s)

    def score_batch(self, samples: list[RewardSample | Mapping]) -> tuple[list[float], dict[str, float]]:
        """Rewards in the order of `samples`, and stats: reward/mean, reward/max, reward/min (when the batch
        is not empty), reward/errors, reward/timeouts. Raises only for a sample whose scorer cannot be chosen
        (reward.name=auto and an unknown data_source): that is a data/config error, not a scorer failure."""
        samples = [s if isinstance(s, RewardSample) else RewardSample(**s) for s in samples]
        jobs = [
            (
                scorer_path(self.name, self.custom, s.data_source),
                dict(
                    solution_str=s.response,
                    ground_truth=s.ground_truth,
                    extra_info=s.extra_info,
                    data_source=s.data_source,
                    ended_with_eos=s.ended_with_eos,
                ),
            )
            for s in samples
        ]
        rewards = [0.0] * len(jobs)
        outcomes = self._run_inline(jobs) if self.num_workers == 0 else self._run_in_workers(jobs)
        errors, timeouts, self.last_errors = 0, 0, []
        for i, (status, value) in enumerate(outcomes):
            if status == "ok":
                rewards[i] = value
            else:
                errors += status == "error"
                timeouts += status == "timeout"
                self.last_errors.append((i, value))
        if self.last_errors:
            logger.warning(
                "reward: %d errors and %d timeouts in %d samples; first: sample %d: %s",
                errors,
                timeouts,
                len(jobs),
                *self.last_errors[0],
            )
        stats = {"reward/errors": float(errors), "reward/timeouts": float(timeouts)}
        if rewards:
            stats.update(
                {
                    "reward/mean": math.fsum(rewards) / len(rewards),
                    "reward/max": max(rewards),
                    "reward/min": min(rewards),
                }
            )
        return rewards, stats

    def close(self) -> None:
        """Stops the workers (also done when the pool is garbage-collected or the process exits)."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _run_inline(self, jobs) -> list[tuple[str, Any]]:
        outcomes = []
        for path, kwargs in jobs:
            try:
                outcomes.append(("ok", load_scorer(path)(**kwargs)))
            except Exception as e:
                outcomes.append(("error", f"{type(e).__name__}: {e}"))
        return outcomes

    def _run_in_workers(self, jobs) -> list[tuple[str, Any]]:
        outcomes: list = [None] * len(jobs)
        pending = deque(range(len(jobs)))
        failed_starts = 0
        while len(self._workers) < min(self.num_workers, len(jobs)):
            self._workers.append(_Worker(self._preload))
        while pending or any(w.task is not None for w in self._workers):
            for i, w in enumerate(self._workers):
                if w.dead:
                    w = self._workers[i] = _Worker(self._preload)
                if w.ready and w.task is None and pending:
                    task = pending.popleft()
                    if not w.submit(task, jobs[task], self.timeout_s):
                        pending.appendleft(task)  # the worker had died while idle; its replacement takes it
            live = [w for w in self._workers if not w.dead and (not w.ready or w.task is not None)]
            if live:
                wait(
                    [w.conn for w in live], timeout=max(0.0, min(w.deadline for w in live) - time.monotonic())
                )
            for w in live:
                result = w.poll()
                if result is not None:
                    task, status, value = result
                    if task is not None:
                        outcomes[task] = (status, value)
                    else:  # a worker that died before its first sample: a broken environment, not a scorer
                        failed_starts += 1
                        if failed_starts >= 3:
                            raise RuntimeError(f"reward: scoring workers keep failing to start: {value}")
        return outcomes


class _Worker:
    """One scoring process and the sample it is working on (`task`, an index into the batch)."""

    def __init__(self, preload: list[str]):
        parent, child = Pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distflow.rewards._worker", str(child.fileno())],
            pass_fds=[child.fileno()],
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.conn = parent
        self.conn.send((list(sys.path), preload))
        self.ready, self.dead, self.task = False, False, None
        self.deadline = time.monotonic() + _STARTUP_TIMEOUT_S

    def submit(self, task: int, job, timeout_s: float) -> bool:
        """Sends one sample; False (and the worker marked dead) when the worker is gone."""
        try:
            self.conn.send(job)
        except OSError:
            self.kill()
            return False
        self.task, self.deadline = task, time.monotonic() + timeout_s
        return True

    def poll(self) -> tuple[int | None, str, Any] | None:
        """(task, status, value) once the worker answered, died or ran out of time; None while it works."""
        task = self.task
        try:
            if self.conn.poll():
                status, value = self.conn.recv()
                if status == "ready":
                    self.ready = True
                    return None
                self.task = None
                if status == "ok":
                    return task, status, value
                return task, "error", value
        except (EOFError, OSError):
            self.kill()
            return task, "error", f"scoring worker died (exit code {self.proc.returncode})"
        if time.monotonic() >= self.deadline:
            self.kill()
            if task is None:
                return None, "error", f"scoring worker did not start within {_STARTUP_TIMEOUT_S:.0f} s"
            return task, "timeout", "scorer timed out"
        return None

    def kill(self) -> None:
        self.dead, self.task = True, None
        self.proc.kill()
        self.proc.wait()
        self.conn.close()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        w.conn.close()  # the worker sees EOF and exits
    for w in workers:
        try:
            w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
    workers.clear()
