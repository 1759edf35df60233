"""CheckpointError: a resume source or a checkpoint folder that cannot be used, with what was expected."""


class CheckpointError(ValueError):
    """Raised before any state is touched: names the path at fault and what a valid one looks like."""
