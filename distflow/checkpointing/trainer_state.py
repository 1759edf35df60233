"""Checkpointer: a run's whole training state saved every checkpoint.save_every steps and restored on resume.

One checkpoint folder (step_<N>, see directory.py) holds:
    <role>/          each trainable worker's Megatron dist checkpoint (model + optimizer, worker_state.py),
                     with its HF source (config, tokenizer: model_folder.py), so that
                     tools/convert_megatron_to_hf.py exports it and <role>.load starts from it
    rank_<r>.pt      rank r's own state: RNG streams, its prompt loader's position, the LR schedulers, and
                     the rollouts it generated ahead (rollout.max_staleness > 0)
    meta.json        step, tracker run id, world size and each role's layout and model
    manifest.json    every file's size and SHA-256 (written last; resume checks it: manifest.py)
Every rank calls save/restore together. Resuming needs the same world size, layouts and model: the per-rank
files are tied to ranks (a different layout gets a CheckpointError naming what differs).
"""

import dataclasses
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from distflow.checkpointing import manifest
from distflow.checkpointing.directory import (
    META_FILE,
    CheckpointDirectory,
    resolve_resume,
    structure_problems,
)
from distflow.checkpointing.errors import CheckpointError, CheckpointWriteError
from distflow.checkpointing.model_folder import record_hf_source
from distflow.checkpointing.rng import capture_rng_state, restore_rng_state
from distflow.checkpointing.worker_state import load_worker, save_worker

FORMAT = "distflow-training-checkpoint"
FORMAT_VERSION = 1
# The HF config fields that identify a model's architecture (a checkpoint of another model cannot load).
MODEL_FIELDS = (
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
)


class Checkpointer:
    """Saves and restores the training state of one rank; every rank builds one with the same arguments.

    cfg: the `checkpoint` section (save_every, keep_last, resume). output_dir: trainer.output_dir.
    The resume source is resolved (and checked) in the constructor, before any worker is built, so that
    the tracker can be given the run id and step to continue (`tracker_resume`).
    Workers are passed as a dict role -> MegatronWorker of the roles whose state the run changes: the trainable
    ones ({"actor": ..., "critic": ...}) and a reference made from the warmed-up actor (model only).
    """

    def __init__(self, cfg, output_dir, rank: int, world_size: int):
        if cfg.keep_last < 1:
            raise CheckpointError(f"checkpoint.keep_last={cfg.keep_last}: keep at least 1 checkpoint")
        if cfg.save_every < 0:
            raise CheckpointError(
                f"checkpoint.save_every={cfg.save_every}: 0 (only at the end) or a step count"
            )
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.directory = CheckpointDirectory.of_run(output_dir)
        self.resume_from = resolve_resume(cfg.resume, output_dir, check=self._problems)
        self.meta = read_meta(self.resume_from) if self.resume_from is not None else None
        self.rank_state: dict = {}
        """After restore: the `rank_state` this rank saved (empty for a fresh run)."""

    def _problems(self, folder: Path) -> list[str]:
        """A checkpoint's problems: its structure, then (checkpoint.checksums) its bytes, read by all ranks."""
        problems = structure_problems(folder)
        if problems or not self.cfg.checksums:
            return problems
        return manifest.check(folder, checksums=True)

    def tracker_resume(self) -> dict:
        """Tracker keyword arguments: the run id and step to continue; a fresh run continues step 0 (rows a
        crashed attempt logged before its first checkpoint are dropped)."""
        if self.meta is None:
            return {"resume_step": 0}
        return {"run_id": self.meta["run_id"], "resume_step": self.meta["step"]}

    def restore(self, workers: dict, loader) -> int:
        """Loads the resume checkpoint into the workers, the loader and the RNGs; returns its step (0: fresh)."""
        if self.meta is None:
            return 0
        path = self.resume_from
        check_compatible(path, self.meta, describe_run(workers, self.world_size))
        for role, worker in workers.items():
            load_worker(worker, path / role)
        rank_file = path / f"rank_{self.rank}.pt"
        if not rank_file.is_file():
            raise CheckpointError(f"{path}: no {rank_file.name} (the per-rank state of rank {self.rank})")
        state = torch.load(rank_file, weights_only=False)
        for role, worker in _trained(workers).items():
            # Megatron's scheduler adds the saved step count to its own (1 after the builder's first step).
            worker.scheduler.num_steps = 0
            worker.scheduler.load_state_dict(state["schedulers"][role])
        if loader is not None:
            if state["loader"] is None:
                raise CheckpointError(
                    f"{rank_file}: holds no prompt-loader state but rank {self.rank} reads prompts"
                )
            loader.load_state_dict(state["loader"])
        restore_rng_state(state["rng"])
        self.rank_state = state.get("rank_state") or {}
        return int(self.meta["step"])

    def should_save(self, step: int, total_steps: int) -> bool:
        return step == total_steps or (self.cfg.save_every > 0 and step % self.cfg.save_every == 0)

    def save(
        self, step: int, workers: dict, loader, run_id: str | None, rank_state: dict | None = None, **extra
    ) -> Path:
        """Writes step_<step> (all ranks), then points `latest` at it and prunes (rank 0); returns its path.
        `rank_state`: this rank's further state (picklable), read back from `self.rank_state` after restore.
        `extra`: small JSON values of rank 0 to keep in meta.json (read back from `self.meta` on resume).
        A failure while writing (disk full, ...) raises CheckpointWriteError naming the folder; the steps
        saved before stay intact (the new one is written aside and only renamed once complete)."""
        staging = self.directory.staging(step)
        try:
            return self._save(staging, step, workers, loader, run_id, rank_state, extra)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # torch.distributed.checkpoint's CheckpointException is a BaseException
            raise CheckpointWriteError(self._write_failure(step, staging, err)) from err

    def _write_failure(self, step: int, staging: Path, err: Exception) -> str:
        try:
            free = f"{shutil.disk_usage(staging.parent).free / 2**30:.2f} GiB free there"
        except OSError as exc:
            free = f"its disk unreadable: {exc.strerror}"
        try:
            latest = self.directory.latest()
        except CheckpointError:  # a damaged `latest`: resume=auto picks the newest intact step anyway
            latest = None
        kept = (
            f"the last complete checkpoint, {latest}, is intact" if latest else "no earlier checkpoint exists"
        )
        return (
            f"rank {self.rank}: writing checkpoint step {step} to {staging} failed ({free}); {kept}; the "
            f"unfinished folder is removed by the next save. Cause: {type(err).__name__}: {err}"
        )

    def _save(self, staging: Path, step: int, workers: dict, loader, run_id, rank_state, extra) -> Path:
        if self.rank == 0:
            self.directory.prepare_staging(step)
            for role in workers:
                (staging / role).mkdir()
        dist.barrier()
        for role, worker in workers.items():
            save_worker(worker, staging / role)
        torch.save(
            {
                "rng": capture_rng_state(),
                "loader": loader.state_dict() if loader is not None else None,
                "schedulers": {role: w.scheduler.state_dict() for role, w in _trained(workers).items()},
                "rank_state": rank_state or {},
            },
            staging / f"rank_{self.rank}.pt",
        )
        dist.barrier()
        if self.rank == 0:
            for role, worker in workers.items():
                record_hf_source(staging / role, worker, role, step)
            meta = {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "step": step,
                "run_id": run_id,
                **describe_run(workers, self.world_size),
                **extra,
            }
            (staging / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        dist.barrier()
        entries = manifest.describe(staging, checksums=self.cfg.checksums)  # every rank hashes its share
        if self.rank == 0:
            manifest.write(staging, entries)
            self.directory.commit(step, self.cfg.keep_last)
        dist.barrier()
        return self.directory.final(step)


def _trained(workers: dict) -> dict:
    return {role: w for role, w in workers.items() if w.trains}


def describe_run(workers: dict, world_size: int) -> dict:
    """What a checkpoint must match to be loaded: world size, and each role's layout and model."""
    roles = {}
    for role, worker in workers.items():
        config = worker.checkpoint.config
        roles[role] = {
            "layout": dataclasses.asdict(worker.layout),
            "model": {k: config.get(k) for k in MODEL_FIELDS},
        }
    return {"world_size": world_size, "roles": roles}


def read_meta(path: Path) -> dict:
    meta_file = Path(path) / META_FILE
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{meta_file}: unreadable ({err}); expected the {META_FILE} of a DistFlow checkpoint"
        ) from err
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{meta_file}: format {meta.get('format')!r} version {meta.get('format_version')!r}; "
            f"expected {FORMAT!r} version {FORMAT_VERSION}"
        )
    return meta


def check_compatible(path: Path, meta: dict, now: dict) -> None:
    """Raises CheckpointError listing every difference between the checkpoint's run and this one."""
    problems = []
    if meta["world_size"] != now["world_size"]:
        problems.append(f"world size {meta['world_size']} (now {now['world_size']})")
    saved, current = set(meta["roles"]), set(now["roles"])
    if not current:  # a rollout-only rank (disaggregated placement) holds no worker to compare
        saved = set()
    if saved != current:
        problems.append(f"trainable roles {sorted(saved)} (now {sorted(current)})")
    for role in sorted(saved & current):
        for part in ("layout", "model"):
            was, is_ = meta["roles"][role][part], now["roles"][role][part]
            diff = {
                k: (was.get(k), is_.get(k)) for k in sorted(set(was) | set(is_)) if was.get(k) != is_.get(k)
            }
            if diff:
                problems.append(
                    f"{role} {part}: " + ", ".join(f"{k}={a} (now {b})" for k, (a, b) in diff.items())
                )
    if problems:
        raise CheckpointError(
            f"cannot resume from {path}: it was written by a different run: "
            + "; ".join(problems)
            + ". Resume with the same layout and model, or start fresh "
            "(checkpoint.resume=never with another trainer.output_dir)"
        )
