"""CheckpointError: a resume source or a checkpoint folder that cannot be used, with what was expected;
CheckpointWriteError: a save that failed, with where and what is left intact."""


class CheckpointError(ValueError):
    """Raised before any state is touched: names the path at fault and what a valid one looks like."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, read-only or vanished folder, a writer that
    failed): names the folder, the free space left there, and the last complete checkpoint, which is intact."""
