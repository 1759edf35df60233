"""Runs a Python script or module under torchrun in a subprocess, with a hard timeout.

Tests spawn their own processes through this so that a hung collective (or Megatron's checkpoint writer
dying, which makes its parent wait forever) fails the test with the job's output instead of hanging CI.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class JobFailed(RuntimeError):
    """A job that failed or timed out; its message ends with the output's last lines, `output` holds all of
    it (an engine's log tail, printed after a rank's error, can push that error out of the last lines)."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def torchrun(
    target: str,
    nproc: int,
    args=(),
    timeout_s: float = 300,
    env: dict | None = None,
    module: bool = False,
    cwd: str | None = None,
    max_restarts: int = 0,
) -> str:
    """Runs `torchrun --standalone --nproc-per-node nproc [--max-restarts k] target args...`; returns combined
    output.

    target is a script path, or a module name when module=True. Raises JobFailed with the output's tail on
    a non-zero exit or on timeout (the whole process group is killed).
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    if max_restarts:
        cmd.append(f"--max-restarts={max_restarts}")
    cmd += ["-m", target] if module else [str(target)]
    cmd += [str(a) for a in args]
    return run(cmd, timeout_s=timeout_s, env=env, cwd=cwd)


def run(cmd, timeout_s: float = 300, env: dict | None = None, cwd: str | None = None) -> str:
    """Runs a command in its own process group; returns its combined output or raises JobFailed.

    Output goes to a temporary file, not a pipe: a descendant that outlives the command (e.g. a checkpoint
    writer process left by a crashed rank) would hold a pipe open and block reading it past any timeout.
    """
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
            cwd=cwd or REPO_ROOT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            timed_out = True
        log.seek(0)
        out = log.read()
    if timed_out:
        raise JobFailed(f"timed out after {timeout_s:.0f} s: {' '.join(map(str, cmd))}\n{_tail(out)}", out)
    if proc.returncode != 0:
        raise JobFailed(f"exit code {proc.returncode}: {' '.join(map(str, cmd))}\n{_tail(out)}", out)
    return out


def _tail(text: str, lines: int = 80) -> str:
    return "\n".join((text or "").splitlines()[-lines:])


def tagged_json(output: str, tag: str) -> list:
    """The JSON payloads of every `TAG {...}` line that the job's ranks printed, in output order.

    Ranks share one output file and, under PYTHONUNBUFFERED, print() writes its text and its newline in two
    calls, so two ranks' lines can come out joined ("TAG {..}TAG {..}\n\n"). A print's own text stays whole,
    so each payload is decoded where it starts and whatever follows it is ignored.
    """
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(output, match.end())[0] for match in re.finditer(re.escape(tag) + " ", output)]


def tagged_text(output: str, tag: str) -> list[str]:
    """The text after every `TAG ` up to the end of its line (which may carry another rank's joined line)."""
    return re.findall(re.escape(tag) + r" ([^\n]*)", output)
