"""Training checkpoints and resume: what a run saves every checkpoint.save_every steps and how it continues.

checkpointer = Checkpointer(cfg.checkpoint, output_dir, rank, world_size)   # resolves checkpoint.resume
tracker = Tracker(..., **checkpointer.tracker_resume())
start = checkpointer.restore({"actor": actor, "critic": critic}, loader)    # 0 for a fresh run
...
if checkpointer.should_save(step, total_steps):
    checkpointer.save(step, workers, loader, tracker.run_id)
"""

from distflow.checkpointing import manifest
from distflow.checkpointing.directory import CheckpointDirectory, resolve_resume
from distflow.checkpointing.errors import CheckpointError
from distflow.checkpointing.trainer_state import Checkpointer

__all__ = ["Checkpointer", "CheckpointDirectory", "CheckpointError", "manifest", "resolve_resume"]
