"""Failures during a weight sync, reported to every rank at the same collective.

A rank that fails must not leave its peers waiting in a collective it skips, and must not raise alone: it
records its exception (RankErrors.run), skips its own remaining work, and still enters the next exchange,
where every rank learns which ranks failed and all raise the same WeightSyncError.
"""

import torch.distributed as dist


class WeightSyncError(RuntimeError):
    """A weight sync failed; raised on every rank. The engine keeps serving nothing until a sync succeeds.
    `failures`: [(rank, "ErrorType: message")], the same on every rank."""

    def __init__(self, text: str, failures: list[tuple[int, str]] = ()):
        super().__init__(text)
        self.failures = list(failures)

    @property
    def engines_died(self) -> bool:
        """Every failure is an engine death or stall (restartable in place), not a fault of the sync itself."""
        return bool(self.failures) and all(
            m.startswith(("EngineDiedError:", "EngineTimeoutError:")) for _, m in self.failures
        )


class RankErrors:
    """This rank's failure in one sync, held until the next exchange (collective over the default group).

    what: the operation named in the error ("weight sync to version 3"). on_failure(text): called on every rank
    just before it raises (the engine owner marks its engine stale there).
    """

    def __init__(self, what: str, on_failure=None):
        self.what, self.on_failure = what, on_failure
        self.error: str | None = None

    def run(self, fn, *args, default=None):
        """fn(*args), unless this rank already failed since the last exchange (then `default`). An exception is
        recorded, not raised: every rank must reach the exchange to hear about it."""
        if self.error is not None:
            return default
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - reported at the next exchange, on every rank
            self.error = f"{type(exc).__name__}: {exc}"
            return default

    def exchange(self, payload=None) -> list:
        """All-gathers (this rank's error, payload): one all_gather_object whatever happened. Returns every
        rank's payload, by rank; raises WeightSyncError on every rank if any rank recorded an error, naming the
        first failed rank with its error and the other failed ranks."""
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (self.error, payload))
        failed = [(r, e) for r, (e, _) in enumerate(gathered) if e]
        if not failed:
            return [p for _, p in gathered]
        rank, message = failed[0]
        text = f"{self.what} failed on rank {rank}: {message}" + (
            f" (and on ranks {[r for r, _ in failed[1:]]})" if len(failed) > 1 else ""
        )
        if self.on_failure is not None:
            self.on_failure(text)
        raise WeightSyncError(text + "; an engine whose update began is stale until a sync succeeds", failed)
