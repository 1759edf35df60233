"""A scoring worker process (started by RewardPool as `python -m distflow.rewards._worker FD`).

A plain interpreter rather than a multiprocessing child: spawn would re-import the trainer's __main__ (torch,
Megatron: seconds and hundreds of MB per worker), and fork is unsafe in a process with threads. Protocol over
the socket FD (multiprocessing Connection framing): receive the parent's sys.path and the scorer paths to
preload, answer ("ready", None); then for each (path, kwargs) answer ("ok", float) or ("error", message).
Exits when the parent closes the socket. A scorer that hangs is killed by the parent.
"""

import sys
import traceback
from multiprocessing.connection import Connection

from distflow.rewards.registry import load_scorer


def main(fd: int) -> None:
    conn = Connection(fd)
    sys_path, preload = conn.recv()
    sys.path[:] = sys_path

    for path in preload:
        try:
            load_scorer(path)
        except Exception:  # reported per sample when the scorer is used
            pass
    conn.send(("ready", None))
    while True:
        try:
            path, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", load_scorer(path)(**kwargs)))
        except BaseException as e:  # a scorer's failure is a result (SystemExit included), not our death
            where = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
            at = f" at {where[0].filename}:{where[0].lineno}" if where else ""
            conn.send(("error", f"{type(e).__name__}: {e}{at}"))


if __name__ == "__main__":
    main(int(sys.argv[1]))
