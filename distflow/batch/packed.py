"""PackedBatch: one rank's samples in a form that moves without per-sample messages or pickling.

Per-sample metadata (sample id, prompt group id, length in tokens) are int64 vectors. A field is either
ragged (token-level: a flat [total_rows, *inner] tensor of the samples' unpadded rows back to back, with
int64 row counts per sample) or fixed (one row per sample: [n, *inner]). FieldSchema describes one field
well enough for a receiver to preallocate it from row counts alone.
`infos` (optional) holds per-sample Python objects keyed by sample id (the rollout's SampleInfo: response
ids, ground truth, data source): they travel with the batch on the rank that made it (subsets keep theirs)
and never move between layouts, where only the tensors go.
"""

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class FieldSchema:
    dtype: torch.dtype
    inner_shape: tuple[int, ...] = ()
    ragged: bool = True

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.inner_shape, dtype=np.int64)) * _itemsize(self.dtype)

    def describe(self) -> str:
        kind = "ragged" if self.ragged else "fixed"
        return (
            f"{str(self.dtype).removeprefix('torch.')}[{kind}{''.join(f', {d}' for d in self.inner_shape)}]"
        )

    def encode(self) -> list:
        return [str(self.dtype).removeprefix("torch."), list(self.inner_shape), self.ragged]

    @classmethod
    def decode(cls, data) -> "FieldSchema":
        return cls(getattr(torch, data[0]), tuple(data[1]), bool(data[2]))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def row_index(starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Flat row indices of the runs [starts[i], starts[i] + counts[i]) back to back, without a Python loop."""
    total = int(counts.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.long, device=starts.device)
    run_first = torch.cumsum(counts, 0) - counts  # where each run begins in the output
    shift = torch.repeat_interleave(starts - run_first, counts, output_size=total)
    return torch.arange(total, device=starts.device) + shift


def copy_runs(dst: torch.Tensor, dst_starts, src: torch.Tensor, src_starts, counts) -> None:
    """dst[dst_starts[i]:+counts[i]] = src[src_starts[i]:+counts[i]] for every run i (dim 0 rows).

    Runs that continue each other on both sides merge first; long runs become slice copies (memcpy),
    many short ones one vectorised index_copy_. Samples sent in id order are often long runs.
    """
    dst_starts, src_starts, counts = (np.asarray(x, dtype=np.int64) for x in (dst_starts, src_starts, counts))
    keep = counts > 0
    dst_starts, src_starts, counts = dst_starts[keep], src_starts[keep], counts[keep]
    if not counts.size:
        return
    ends = np.cumsum(counts)
    follows = np.zeros(len(counts), dtype=bool)
    follows[1:] = (src_starts[1:] == src_starts[:-1] + counts[:-1]) & (
        dst_starts[1:] == dst_starts[:-1] + counts[:-1]
    )
    heads = np.flatnonzero(~follows)
    run_rows = np.diff(np.append(ends[heads] - counts[heads], ends[-1]))
    if len(heads) <= 32 or run_rows.mean() >= 256:
        for d, s_, n in zip(dst_starts[heads].tolist(), src_starts[heads].tolist(), run_rows.tolist()):
            dst[d : d + n].copy_(src[s_ : s_ + n])
        return
    device = dst.device
    rows_src = row_index(torch.from_numpy(src_starts), torch.from_numpy(counts)).to(src.device)
    rows_dst = row_index(torch.from_numpy(dst_starts), torch.from_numpy(counts)).to(device)
    dst.index_copy_(0, rows_dst, src.index_select(0, rows_src).to(device))


class PackedBatch:
    """Samples held by one rank. Construct with tensors; `from_samples` builds it from per-sample tensors."""

    def __init__(
        self,
        sample_ids,
        groups,
        lengths,
        fields: Mapping[str, torch.Tensor],
        row_counts: Optional[Mapping[str, torch.Tensor]] = None,
        infos: Optional[Mapping[int, Any]] = None,
    ):
        self.sample_ids = torch.as_tensor(sample_ids, dtype=torch.long).reshape(-1)
        self.groups = torch.as_tensor(groups, dtype=torch.long).reshape(-1)
        self.lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1)
        self.fields = {name: t.contiguous() for name, t in fields.items()}
        self.row_counts = {
            name: torch.as_tensor(c, dtype=torch.long).reshape(-1) for name, c in (row_counts or {}).items()
        }
        n = len(self.sample_ids)
        self.infos = None
        if infos is not None:  # restricted to this batch's samples, so a subset carries only its own
            ids = self.sample_ids.tolist()
            self.infos = {i: infos[i] for i in ids if i in infos}
            missing = [i for i in ids if i not in infos] if len(self.infos) < len(ids) else []
            if missing:
                raise ValueError(f"infos lack sample ids {missing[:5]} ({len(missing)} of {n})")
        if len(self.groups) != n or len(self.lengths) != n:
            raise ValueError(
                f"{n} sample ids but {len(self.groups)} group ids and {len(self.lengths)} lengths"
            )
        for name in self.row_counts:
            if name not in self.fields:
                raise ValueError(f"row counts given for {name!r}, which is not a field")
        for name, t in self.fields.items():
            counts = self.row_counts.get(name)
            if counts is None:
                if t.dim() == 0 or t.shape[0] != n:
                    raise ValueError(f"fixed field {name!r} has shape {tuple(t.shape)}; it needs [{n}, ...]")
            elif len(counts) != n or (t.dim() == 0) or t.shape[0] != int(counts.sum()):
                raise ValueError(
                    f"ragged field {name!r} has {t.shape[0] if t.dim() else 0} rows but its "
                    f"{len(counts)} row counts sum to {int(counts.sum())} ({n} samples)"
                )

    @classmethod
    def from_samples(
        cls,
        sample_ids: Sequence[int],
        groups: Sequence[int],
        fields: Mapping[str, Sequence[torch.Tensor] | torch.Tensor],
        lengths: Optional[Sequence[int]] = None,
        length_field: str = "input_ids",
        infos: Optional[Mapping[int, Any]] = None,
    ) -> "PackedBatch":
        """A field given as a list of per-sample tensors is ragged (concatenated, rows = dim 0 of each);
        a field given as one tensor [n, ...] is fixed. lengths default to the row counts of `length_field`."""
        packed, counts = {}, {}
        for name, value in fields.items():
            if isinstance(value, torch.Tensor):
                packed[name] = value
            else:
                value = list(value)
                counts[name] = torch.tensor([v.shape[0] for v in value], dtype=torch.long)
                packed[name] = torch.cat(value) if value else torch.zeros(0)
        if lengths is None:
            if length_field not in counts:
                raise ValueError(f"pass lengths, or a ragged field {length_field!r} to take them from")
            lengths = counts[length_field]
        return cls(sample_ids, groups, lengths, packed, counts, infos)

    @classmethod
    def empty(cls, schema: Mapping[str, FieldSchema], device="cpu") -> "PackedBatch":
        fields = {
            n: torch.zeros((0, *s.inner_shape), dtype=s.dtype, device=device) for n, s in schema.items()
        }
        zeros = torch.zeros(0, dtype=torch.long)
        return cls(zeros, zeros, zeros, fields, {n: zeros for n, s in schema.items() if s.ragged})

    @classmethod
    def concat(cls, batches: Sequence["PackedBatch"]) -> "PackedBatch":
        """The batches' samples back to back (same fields in each; infos when every batch has them)."""
        first = batches[0]

        def cat(xs):
            return torch.cat(list(xs))

        infos = None
        if all(b.infos is not None for b in batches):
            infos = {i: info for b in batches for i, info in b.infos.items()}
        return cls(
            cat(b.sample_ids for b in batches),
            cat(b.groups for b in batches),
            cat(b.lengths for b in batches),
            {n: cat(b.fields[n] for b in batches) for n in first.fields},
            {n: cat(b.row_counts[n] for b in batches) for n in first.row_counts},
            infos,
        )

    def __len__(self) -> int:
        return len(self.sample_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.fields.values())

    def schema(self) -> dict[str, FieldSchema]:
        return {
            name: FieldSchema(t.dtype, tuple(t.shape[1:]), name in self.row_counts)
            for name, t in sorted(self.fields.items())
        }

    def rows(self, name: str) -> torch.Tensor:
        """Rows per sample of field `name` (ones for a fixed field)."""
        counts = self.row_counts.get(name)
        return counts if counts is not None else torch.ones(len(self), dtype=torch.long)

    def offsets(self, name: str) -> torch.Tensor:
        rows = self.rows(name)
        return torch.cumsum(rows, 0) - rows

    def field_rows(self, name: str, positions: torch.Tensor) -> torch.Tensor:
        """Row indices into fields[name] of the samples at `positions`, in that order."""
        if name not in self.row_counts:
            return positions
        return row_index(self.offsets(name)[positions], self.row_counts[name][positions])

    def sample(self, i: int) -> dict[str, torch.Tensor]:
        """Sample i's fields (views), for tests and debugging."""
        out = {}
        for name, t in self.fields.items():
            if name in self.row_counts:
                start = int(self.offsets(name)[i])
                out[name] = t[start : start + int(self.row_counts[name][i])]
            else:
                out[name] = t[i]
        return out

    def select(self, positions, fields: Optional[Sequence[str]] = None) -> "PackedBatch":
        """The samples at `positions` (in that order), with `fields` (default: all)."""
        positions = torch.as_tensor(positions, dtype=torch.long)
        out = {}
        for name in self.fields if fields is None else fields:
            src = self.fields[name]
            rows = self.rows(name)[positions].numpy()
            out[name] = torch.empty((int(rows.sum()), *src.shape[1:]), dtype=src.dtype, device=src.device)
            copy_runs(out[name], np.cumsum(rows) - rows, src, self.offsets(name)[positions].numpy(), rows)
        return PackedBatch(
            self.sample_ids[positions],
            self.groups[positions],
            self.lengths[positions],
            out,
            {n: self.row_counts[n][positions] for n in out if n in self.row_counts},
            self.infos,
        )

    def sorted_by_id(self) -> "PackedBatch":
        order = torch.argsort(self.sample_ids, stable=True)
        if torch.equal(order, torch.arange(len(self))):
            return self
        return self.select(order)

    def equals(self, other: "PackedBatch") -> bool:
        """Bit equality of metadata and every field (NaNs compare by their bits)."""
        if set(self.fields) != set(other.fields) or set(self.row_counts) != set(other.row_counts):
            return False
        pairs = [
            (self.sample_ids, other.sample_ids),
            (self.groups, other.groups),
            (self.lengths, other.lengths),
        ]
        pairs += [(self.row_counts[n], other.row_counts[n]) for n in self.row_counts]
        pairs += [(self.fields[n], other.fields[n]) for n in self.fields]
        return all(
            a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b)) for a, b in pairs
        )


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous().cpu().reshape(-1)
    return t.view(torch.uint8) if t.numel() else t.to(torch.uint8)
