"""The padded view of a PackedBatch that the Megatron workers take ([B, S] right-padded tensors), and back."""

import torch

from distflow.batch.packed import PackedBatch


def to_padded(batch: PackedBatch) -> dict[str, torch.Tensor]:
    """A PackedBatch as the Megatron worker's [B, S] right-padded tensors (sorted by sample id).

    Ragged fields become [B, S] ([B, S, *inner] for rows with an inner shape); `attention_mask` is 1 on real tokens (those of input_ids, or of the first
    ragged field in a batch without input_ids, such as `from_padded`'s); fixed per-sample fields stay [B].
    """
    batch = batch.sorted_by_id()
    ragged = sorted(batch.row_counts, key=lambda name: name != "input_ids")
    lengths = batch.rows(ragged[0]) if ragged else torch.zeros(len(batch), dtype=torch.long)
    rows, width = len(batch), int(lengths.max()) if len(batch) else 0
    out = {"attention_mask": (torch.arange(width)[None, :] < lengths[:, None]).long()}
    for name, flat in batch.fields.items():
        if name in batch.row_counts:
            if not torch.equal(batch.row_counts[name], lengths):
                raise ValueError(f"ragged field {name!r} does not have one row per token of {ragged[0]!r}")
            padded = torch.zeros((rows, width, *flat.shape[1:]), dtype=flat.dtype)
            padded[out["attention_mask"].bool()] = flat
            out[name] = padded
        else:
            out[name] = flat
    return out


def from_padded(samples: PackedBatch, padded: dict[str, torch.Tensor]) -> PackedBatch:
    """[B, S] tensors over `samples` in sample-id order (as `to_padded` gives them) -> a PackedBatch of
    token-level fields, one row per token of each sample (like input_ids), so they can move between layouts
    and come back with `to_padded`."""
    samples = samples.sorted_by_id()
    lengths = samples.rows("input_ids")
    width = max((t.shape[1] for t in padded.values()), default=0)
    real = torch.arange(width)[None, :] < lengths[:, None]
    fields = {name: t[real] for name, t in padded.items()}
    return PackedBatch(
        samples.sample_ids, samples.groups, samples.lengths, fields, {name: lengths for name in fields}
    )
