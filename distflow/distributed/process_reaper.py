"""Processes a failed attempt left behind are stopped before the next attempt starts.

A rank killed with SIGKILL (the OOM killer, torchrun stopping a job whose other rank died) cannot stop its
children. SGLang's schedulers and detokenizer die with their parent (PR_SET_PDEATHSIG), but not everything
does: a forked checkpoint writer still writing into the staging folder that the next attempt removes, a
reward scorer process, a grandchild whose parent was not the rank. They keep memory, GPU memory, files and
ports the next attempt needs.

So every rank keeps a list of its descendants (pid and start time, refreshed every REFRESH_S by a daemon
thread) in <trainer.output_dir>/.attempt_pids/<host>/<attempt>.rank<r>.json, and the ranks of a new attempt
first kill, on their host, whatever the lists of earlier attempts name that is still running with the same
start time (a recycled pid is another process and is left alone), then delete those lists. A process that
lives less than REFRESH_S may go unlisted: the checkpoint writers of a save that short, harmless since the
save's staging folder is only removed after every rank has reaped and joined the new attempt's groups.
"""

import json
import logging
import os
import socket
import threading
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)
REFRESH_S = 0.5
KILL_WAIT_S = 10.0  # how long a killed process may take to go (SIGKILL: the kernel's time only)
DIR_NAME = ".attempt_pids"


def attempt_name(restarts: dict[str, int]) -> str:
    """This attempt's name among the job's attempts: SLURM requeues and torchrun restarts."""
    return f"slurm{restarts['slurm']}_torchrun{restarts['torchrun']}"


def host_dir(output_dir) -> Path:
    return Path(output_dir) / DIR_NAME / socket.gethostname()


def descendants() -> list[dict]:
    """This process's descendants as {pid, started, name}."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            found.append({"pid": proc.pid, "started": proc.create_time(), "name": proc.name()})
        except psutil.NoSuchProcess:
            continue
    return found


class DescendantRecorder:
    """Keeps this rank's list of descendants on disk while it runs (a daemon thread)."""

    def __init__(self, output_dir, attempt: str, rank: int):
        self.path = host_dir(output_dir) / f"{attempt}.rank{rank}.json"
        self._last: list[dict] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="descendant-recorder", daemon=True)

    def start(self) -> "DescendantRecorder":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.note_children()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def note_children(self) -> None:
        """Writes the list (tmp + rename: never half-written) if it changed since the last look."""
        current = descendants()
        if current == self._last:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(current))
        os.replace(tmp, self.path)
        self._last = current

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                self.note_children()
            except OSError as exc:  # a full or vanished output disk: the run reports that elsewhere
                logger.warning("cannot record this rank's child processes in %s: %s", self.path, exc)


def start(output_dir, restarts: dict[str, int], rank: int) -> list[str]:
    """At a rank's start, before anything of the attempt runs: reaps what earlier attempts left on this host,
    then starts recording this rank's descendants. Returns what it killed."""
    attempt = attempt_name(restarts)
    killed = reap_previous_attempts(output_dir, attempt)
    DescendantRecorder(output_dir, attempt, rank).start()
    return killed


def reap_previous_attempts(output_dir, attempt: str) -> list[str]:
    """Kills the still-running processes that earlier attempts' ranks on this host listed, and removes
    their lists; returns "name (pid)" of each one killed. Every rank of the host may call it: killing twice
    is harmless, and this attempt's own lists are never touched."""
    folder = host_dir(output_dir)
    if not folder.is_dir():
        return []
    victims: dict[int, psutil.Process] = {}
    lists = [p for p in folder.glob("*.json") if not p.name.startswith(f"{attempt}.")]
    for path in lists:
        try:
            listed = json.loads(path.read_text())
        except (OSError, ValueError):  # unreadable: nothing to go by
            listed = []
        for entry in listed:
            try:
                proc = psutil.Process(entry["pid"])
                if abs(proc.create_time() - entry["started"]) < 0.01 and proc.pid != os.getpid():
                    victims[proc.pid] = proc
            except (psutil.NoSuchProcess, KeyError, TypeError):
                continue
    killed = []
    for proc in victims.values():
        try:
            name = proc.name()
            proc.kill()
            killed.append(f"{name} ({proc.pid})")
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(list(victims.values()), timeout=KILL_WAIT_S)
    for path in lists:
        path.unlink(missing_ok=True)
    return killed
