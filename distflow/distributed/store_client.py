"""A client of the job's key-value store of a caller's own, for waits that may last.

c10d's TCPStore client runs one operation at a time: a `store.wait` that lasts until another rank's work
is done (rollout balancing waiting for the round's last chunk) would hold every other user of the default
store's client in the process meanwhile, the failure watch (dag/failure.py) among them, which then notices
another rank's error only when the wait ends. Polling with short waits instead makes c10d log a warning
each time one runs out ("waitForInput ... timed out after 200ms"), every 200 ms per waiting rank. A second
client, connected to the same server, waits without holding anyone.
"""

import datetime
import functools
import os

import torch.distributed as dist


def attempt_store(
    timeout: datetime.timedelta, name: str = "", world_size: int | None = None, wait_for_workers: bool = True
):
    """A new TCPStore client on the server the job's ranks met at (MASTER_ADDR:MASTER_PORT), its keys under
    this attempt's prefix, distflow/attempt_<TORCHELASTIC_RESTART_COUNT>[/name]: a torchrun restart gets
    fresh keys, none left by the failed attempt."""
    client = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
        wait_for_workers=wait_for_workers,
    )
    prefix = f"distflow/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return dist.PrefixStore(f"{prefix}/{name}" if name else prefix, client)


@functools.cache
def own_store_client(name: str, timeout_s: float):
    """A TCPStore client of this process's own for `name`'s keys, on the server the job's ranks met at
    (torchrun's agent store, or rank 0's env:// store), under this attempt's prefix (attempt_store). One per
    name and process. None where the job has no such server (no MASTER_ADDR or MASTER_PORT): the caller
    then uses the default store."""
    if not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
        return None
    return attempt_store(datetime.timedelta(seconds=timeout_s), name, wait_for_workers=False)
