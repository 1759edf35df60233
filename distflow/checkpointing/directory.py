"""The checkpoints folder of a run: staging, commit by rename, the `latest` pointer, pruning, resume lookup.

Layout of <output_dir>/checkpoints/:
    step_<N>/                  one complete checkpoint (meta.json, then manifest.json written last, before
                               the rename)
    .incomplete_step_<N>/      a checkpoint being written; left behind only by a crash, never read
    .damaged_step_<N>/         a damaged step_<N> moved aside when step N was saved again (kept, never read)
    latest                     the name of the newest complete checkpoint ("step_<N>\n")

A save writes everything into the staging folder, renames it to step_<N> (atomic within a file system),
then replaces `latest` atomically (temp file + os.replace). A crash at any point leaves `latest` naming
the previous complete checkpoint, which is therefore never pruned before the new one is committed.

Resume (`resolve_resume`) trusts no folder blindly: a step folder is used only if it matches its manifest
(manifest.py). checkpoint.resume=auto takes the newest intact step folder, saying so loudly when that is
not the one `latest` names (a damaged latest step, a missing `latest`); a run whose folder holds step
folders never starts fresh over them.
"""

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Callable

from distflow.checkpointing import manifest
from distflow.checkpointing.errors import CheckpointError

logger = logging.getLogger(__name__)

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
        if final.exists():  # step N saved again: only a damaged step_N can be in the way (resume skips it)
            problems = manifest.check(final, checksums=False)
            if not problems or self.latest_name() == final.name:
                raise CheckpointError(
                    f"{final} exists and is a complete checkpoint; refusing to overwrite it"
                )
            aside = self.root / f".damaged_{final.name}"
            if aside.exists():
                shutil.rmtree(aside)
            os.replace(final, aside)
            logger.warning("%s was damaged (%s); moved aside to %s", final, "; ".join(problems), aside)
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

    def latest_name(self) -> str | None:
        """What `latest` says, unchecked (None without the file)."""
        pointer = self.root / LATEST_FILE
        return pointer.read_text().strip() if pointer.is_file() else None

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


Check = Callable[[Path], list]


def structure_problems(folder: Path) -> list[str]:
    """What makes `folder` unusable without reading its data: meta.json, and the files against the manifest
    by name and size. A folder from before manifests passes on its meta.json (with a warning)."""
    if not (folder / META_FILE).is_file():
        return [f"no {META_FILE} (the save did not finish)"]
    problems = manifest.check(folder, checksums=False)
    if problems and not (folder / manifest.MANIFEST_FILE).exists():
        logger.warning(
            "%s has no %s (an older DistFlow wrote it): not verified", folder, manifest.MANIFEST_FILE
        )
        return []
    return problems


def resolve_resume(resume: str, output_dir, check: Check = structure_problems) -> Path | None:
    """The checkpoint folder to resume from, or None to start fresh (checkpoint.resume).

    auto: the newest intact step folder in <output_dir>/checkpoints, if any (a run with step folders, none of
    them intact, is refused rather than started over); never: none (and the run's checkpoints folder must not
    hold checkpoints, which a fresh run would overwrite); a path: a step_<N> folder, or a checkpoints folder
    (its `latest`), which must be intact. `check(folder)` -> its problems (default: structure_problems; the
    trainer adds checksums). Raises CheckpointError naming the damaged files and the intact alternatives.
    """
    own = CheckpointDirectory.of_run(output_dir)
    if resume == "auto":
        return _newest_intact(own, check)
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
        return _intact(path, check)
    if (path / LATEST_FILE).is_file():
        return _intact(CheckpointDirectory(path).latest(), check)
    raise CheckpointError(
        f"checkpoint.resume={resume!r} is not a DistFlow checkpoint: it has no {META_FILE} "
        f"(a step_<N> folder) and no {LATEST_FILE} file (a checkpoints/ folder)"
    )


def _newest_intact(directory: CheckpointDirectory, check: Check) -> Path | None:
    steps = directory.complete_steps()
    damaged = []
    for step in reversed(steps):
        folder = directory.final(step)
        problems = check(folder)
        if not problems:
            named = directory.latest_name()
            if damaged or named != folder.name:
                logger.warning(
                    "checkpoint.resume=auto: resuming from %s, the newest intact checkpoint (`latest` names %s)%s",
                    folder,
                    named,
                    "".join(f"; {d}" for d in damaged),
                )
            return folder
        damaged.append(f"{folder.name} is damaged: " + "; ".join(problems))
    if damaged:
        raise CheckpointError(
            f"checkpoint.resume=auto: no intact checkpoint in {directory.root}, and this run will not start over "
            "the ones there: "
            + " | ".join(damaged)
            + ". Resume from a copy you trust (checkpoint.resume=<path>), "
            "or start a new run with another trainer.output_dir"
        )
    return None


def _intact(folder: Path, check: Check) -> Path:
    problems = check(folder)
    if not problems:
        return folder
    siblings = CheckpointDirectory(folder.parent)
    others = [siblings.final(s).name for s in siblings.complete_steps() if siblings.final(s) != folder]
    intact = [name for name in others if not check(siblings.root / name)]
    hint = f"; intact checkpoints beside it: {', '.join(intact)}" if intact else ""
    raise CheckpointError(f"cannot resume from {folder}: it is damaged: " + "; ".join(problems) + hint)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
