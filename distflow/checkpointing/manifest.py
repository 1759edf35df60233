"""A checkpoint folder's manifest: every file with its size and SHA-256, written last, checked on resume.

A step folder is intact when its manifest.json lists exactly the files it holds with those sizes and digests.
Sizes are checked on every resume (cheap: a truncated shard, a deleted role folder, a file from another
step); digests catch a damaged byte as well, at the cost of reading the checkpoint once. Both sides share
the reading among the ranks: rank r hashes files r, r + W, ... of the sorted file list, so a 1 TB checkpoint
on 64 ranks reads 16 GB on each.

Checkpoints written before manifests existed have none: `check` reports that, and resume accepts them
with a warning (their meta.json, written last, still marks them complete).
"""

import hashlib
import json
import os
from pathlib import Path

import torch.distributed as dist

MANIFEST_FILE = "manifest.json"
_CHUNK = 8 << 20


def files_of(folder: Path) -> list[str]:
    """Every file under `folder` (relative POSIX paths, sorted), the manifest itself excepted."""
    out = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel != MANIFEST_FILE:
                out.append(rel)
    return sorted(out)


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _share(names: list[str]) -> list[str]:
    """This rank's share of `names` (all of them without a process group)."""
    if not dist.is_available() or not dist.is_initialized():
        return names
    return names[dist.get_rank() :: dist.get_world_size()]


def _gather(part: dict) -> dict:
    if not dist.is_available() or not dist.is_initialized():
        return part
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    return {k: v for p in parts for k, v in p.items()}


def describe(folder: Path, checksums: bool) -> dict:
    """{file: {"size", "sha256"?}} for every file of `folder` (collective when a process group exists: each
    rank hashes its share)."""
    folder = Path(folder)
    names = files_of(folder)
    part = {}
    for name in _share(names):
        entry = {"size": (folder / name).stat().st_size}
        if checksums:
            entry["sha256"] = digest(folder / name)
        part[name] = entry
    return _gather(part)


def write(folder: Path, entries: dict) -> None:
    """Writes manifest.json (to a temporary name first, then renamed: a torn manifest never exists)."""
    tmp = Path(folder) / f".{MANIFEST_FILE}.tmp"
    with open(tmp, "w") as f:
        json.dump({"files": entries}, f, indent=0, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, Path(folder) / MANIFEST_FILE)


def check(folder: Path, checksums: bool) -> list[str]:
    """What is wrong with `folder` against its manifest (empty: intact). Collective when a process group
    exists and `checksums` (each rank hashes its share); sizes are checked everywhere."""
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return [f"no {MANIFEST_FILE} (written by an older DistFlow, or the save did not finish)"]
    try:
        listed = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError) as err:
        return [f"{path} is unreadable ({err})"]
    problems = []
    present = set(files_of(folder))
    for name in sorted(set(listed) - present):
        problems.append(f"{folder / name} is missing")
    for name in sorted(present - set(listed)):
        problems.append(f"{folder / name} is not in the manifest")
    for name in sorted(set(listed) & present):
        size = (folder / name).stat().st_size
        if size != listed[name]["size"]:
            problems.append(f"{folder / name} has {size} bytes, the manifest {listed[name]['size']}")
    if checksums:
        hashed = [n for n in sorted(set(listed) & present) if "sha256" in listed[n]]
        part = {n: digest(folder / n) for n in _share(hashed)}
        for name, value in sorted(_gather(part).items()):
            if value != listed[name]["sha256"]:
                problems.append(f"{folder / name} does not match its checksum (damaged)")
    return problems
