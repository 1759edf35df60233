"""The checkpoints folder of a run: staging, commit by rename, the `latest` pointer, pruning, resume lookup.

Layout of <output_dir>/checkpoints/:
    step_<N>/                  one complete checkpoint (meta.json written last, before the rename)
    .incomplete_step_<N>/      a checkpoint being written; left behind only by a crash, never read
    latest                     the name of the newest complete checkpoint ("step_<N>\n")

A save writes everything into the staging folder, renames it to step_<N> (atomic within a file system),
then replaces `latest` atomically (temp file + os.replace). A crash at any point leaves `latest` naming
the previous complete checkpoint, which is therefore never pruned before the new one is committed.
"""

import os
import re
import shutil
from pathlib import Path

from distflow.checkpointing.errors import CheckpointError

META_FILE = "meta.json"
LATEST_FILE = "latest"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointDirectory:
    """A checkpoints folder (root). Only one process (global rank 0) calls the mutating methods."""

    def __init__(self, root):
        self.root = Path(root)

    @classmethod
    def of_run(cls, output_dir) -> "CheckpointDirectory":
        return cls(Path(output_dir) / "checkpoints")

    def staging(self, step: int) -> Path:
        return self.root / f".incomplete_step_{step}"

    def final(self, step: int) -> Path:
        return self.root / f"step_{step}"

    def prepare_staging(self, step: int) -> Path:
        """An empty staging folder for `step` (a crashed attempt's leftovers are removed)."""
        path = self.staging(step)
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def commit(self, step: int, keep_last: int) -> Path:
        """Staging folder -> step_<N>, then `latest` -> step_<N>, then the oldest beyond keep_last removed."""
        final = self.final(step)
        if final.exists():  # the same step saved again (a rerun after a crash between commit and latest)
            if self.latest() == final:
                raise CheckpointError(
                    f"{final} exists and is the latest checkpoint; refusing to overwrite it"
                )
            shutil.rmtree(final)
        os.replace(self.staging(step), final)
        _fsync_dir(self.root)
        tmp = self.root / f".{LATEST_FILE}.tmp"
        with open(tmp, "w") as f:
            f.write(final.name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / LATEST_FILE)
        _fsync_dir(self.root)
        self.prune(keep_last)
        return final

    def latest(self) -> Path | None:
        """The checkpoint `latest` names, or None if there is no `latest` file."""
        pointer = self.root / LATEST_FILE
        if not pointer.is_file():
            return None
        name = pointer.read_text().strip()
        if not _STEP_DIR.match(name) or not (self.root / name / META_FILE).is_file():
            raise CheckpointError(
                f"{pointer} names {name!r}, which is not a complete checkpoint folder "
                f"(expected step_<N> with {META_FILE} in {self.root})"
            )
        return self.root / name

    def complete_steps(self) -> list[int]:
        """Steps of the complete checkpoint folders, ascending."""
        if not self.root.is_dir():
            return []
        steps = [
            int(m.group(1)) for p in self.root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()
        ]
        return sorted(steps)

    def prune(self, keep_last: int) -> None:
        """Removes all but the newest keep_last complete checkpoints; never the one `latest` names."""
        latest = self.latest()
        for step in self.complete_steps()[:-keep_last]:
            if self.final(step) != latest:
                shutil.rmtree(self.final(step))


def resolve_resume(resume: str, output_dir) -> Path | None:
    """The checkpoint folder to resume from, or None to start fresh (checkpoint.resume).

    auto: the latest checkpoint in <output_dir>/checkpoints if there is one; never: none (and the run's
    checkpoints folder must not hold checkpoints, which a fresh run would overwrite); a path: a step_<N>
    folder, or a checkpoints folder (its `latest`). Raises CheckpointError for anything else.
    """
    own = CheckpointDirectory.of_run(output_dir)
    if resume == "auto":
        return own.latest()
    if resume == "never":
        if own.complete_steps():
            raise CheckpointError(
                f"checkpoint.resume=never but {own.root} already holds checkpoints "
                f"{own.complete_steps()}, which this run would overwrite; use "
                "checkpoint.resume=auto to continue it, or another trainer.output_dir"
            )
        return None
    path = Path(resume)
    if not path.exists():
        raise CheckpointError(
            f"checkpoint.resume={resume!r}: no such file or folder (expected auto, never, a "
            "step_<N> checkpoint folder or a run's checkpoints/ folder)"
        )
    if (path / META_FILE).is_file():
        return path
    if (path / LATEST_FILE).is_file():
        return CheckpointDirectory(path).latest()
    raise CheckpointError(
        f"checkpoint.resume={resume!r} is not a DistFlow checkpoint: it has no {META_FILE} "
        f"(a step_<N> folder) and no {LATEST_FILE} file (a checkpoints/ folder)"
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
