"""Stops every rank within a bounded time when a node fails on one rank, with that rank's error.

Without this, the other ranks would block in their next collective until its timeout (minutes) and then
report a useless "connection closed". The failing rank writes its error to the job's key-value store
(torch.distributed's default TCPStore, which every rank already shares); a daemon thread on every rank
polls it and, on seeing an error from another rank, prints it and ends the process. No barrier is added
to the step: the poll is a non-blocking key check every `poll_s` seconds.
"""

import os
import sys
import threading
import traceback

import torch.distributed as dist
from torch.distributed import distributed_c10d

ERROR_KEY = "distflow/failure"
EXIT_CODE = 17


class FailureSignal:
    def __init__(self, store, rank: int, poll_s: float = 0.5):
        self.store, self.rank, self.poll_s = store, rank, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="distflow-failure-watch", daemon=True)

    @classmethod
    def from_default_group(cls, poll_s: float = 0.5) -> "FailureSignal":
        return cls(distributed_c10d._get_default_store(), dist.get_rank(), poll_s)

    def start(self) -> "FailureSignal":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def report(self, node_id: str, exc: BaseException) -> None:
        """Publishes this rank's failure (first writer wins; later failures are consequences)."""
        text = "".join(traceback.format_exception(exc))
        message = f"rank {self.rank} failed in node {node_id!r}: {type(exc).__name__}: {exc}\n{text}"
        try:
            self.store.compare_set(ERROR_KEY, "", message)
        except Exception:  # the store itself is gone: the job is ending anyway
            pass

    def remote_failure(self) -> str | None:
        try:
            if self.store.check([ERROR_KEY]):
                return self.store.get(ERROR_KEY).decode()
        except Exception:
            return None
        return None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            message = self.remote_failure()
            if message and not message.startswith(f"rank {self.rank} "):
                print(f"[distflow] rank {self.rank} stopping: {message}", file=sys.stderr, flush=True)
                os._exit(EXIT_CODE)  # a thread cannot interrupt a blocked collective; ending the process can
