"""NodeContext: what the node functions of one rank share during a run (workers, config, step metrics)."""
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from distflow.coordination.data import PackedBatch


@dataclass
class NodeContext:
    cfg: Any
    cluster: Any
    rank: int
    tokenizer: Any
    rollout: Any = None          # RolloutWorker
    reward_pool: Any = None      # RewardPool (on ranks that hold samples)
    actor: Any = None            # MegatronWorker
    ref: Optional[Any] = None
    reward_model: Optional[Any] = None  # MegatronWorker role "reward" (reward.model_path)
    metrics: dict = field(default_factory=dict)
    prompt_loader: Any = None    # this rank's PromptLoader (engine owners): DAPO draws more prompts from it

    def record(self, **values) -> None:
        self.metrics.update({k: float(v) for k, v in values.items()})


def to_padded(batch: PackedBatch) -> dict[str, torch.Tensor]:
    """A PackedBatch as the Megatron worker's [B, S] right-padded tensors (sorted by sample id).

    Ragged fields become [B, S]; `attention_mask` is 1 on real tokens; fixed per-sample fields stay [B].
    """
    batch = batch.sorted_by_id()
    lengths = batch.rows("input_ids")
    rows, width = len(batch), int(lengths.max()) if len(batch) else 0
    out = {"attention_mask": (torch.arange(width)[None, :] < lengths[:, None]).long()}
    for name, flat in batch.fields.items():
        if name in batch.row_counts:
            padded = torch.zeros((rows, width), dtype=flat.dtype)
            padded[out["attention_mask"].bool()] = flat
            out[name] = padded
        else:
            out[name] = flat
    return out
