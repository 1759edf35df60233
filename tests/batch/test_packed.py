"""PackedBatch (ragged and fixed fields) and the run copier behind packing and unpacking."""

import numpy as np
import pytest
import torch

from distflow.batch import FieldSchema, PackedBatch
from distflow.batch.packed import copy_runs, row_index


def _batch():
    return PackedBatch.from_samples(
        [7, 3, 5],
        [1, 0, 1],
        {
            "input_ids": [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])],
            "rewards": torch.tensor([0.5, -1.0, 2.0]),
        },
    )


def test_ragged_and_fixed_fields():
    b = _batch()
    assert b.lengths.tolist() == [3, 1, 2] and b.num_tokens == 6
    assert b.schema() == {
        "input_ids": FieldSchema(torch.int64),
        "rewards": FieldSchema(torch.float32, (), False),
    }
    assert b.sample(2)["input_ids"].tolist() == [5, 6] and float(b.sample(1)["rewards"]) == -1.0
    s = b.sorted_by_id()
    assert s.sample_ids.tolist() == [3, 5, 7]
    assert s.fields["input_ids"].tolist() == [4, 5, 6, 1, 2, 3] and s.fields["rewards"].tolist() == [
        -1.0,
        2.0,
        0.5,
    ]
    assert s.select([2, 0], ["input_ids"]).equals(
        PackedBatch.from_samples([7, 3], [1, 0], {"input_ids": [torch.tensor([1, 2, 3]), torch.tensor([4])]})
    )
    assert PackedBatch.concat([b.select([0]), b.select([1, 2])]).equals(b)
    assert not b.equals(s)


def test_row_index_and_both_copy_paths():
    assert row_index(torch.tensor([5, 0, 9]), torch.tensor([2, 1, 0])).tolist() == [5, 6, 0]
    src = torch.arange(10_000)
    rng = np.random.default_rng(0)
    for counts in (np.array([3000, 4000]), rng.integers(0, 5, 500)):  # long runs: slices; short: index_copy
        src_starts = np.sort(rng.choice(10_000 - 5, len(counts), replace=False))
        src_starts = np.minimum(src_starts, 10_000 - counts) if counts.max() > 5 else src_starts
        dst_starts = np.cumsum(counts) - counts
        order = rng.permutation(len(counts))
        dst = torch.full((int(counts.sum()),), -1)
        copy_runs(dst, dst_starts[order], src, src_starts[order], counts[order])
        expected = torch.cat([src[s : s + n] for s, n in zip(src_starts, counts)]) if counts.sum() else dst
        assert torch.equal(dst, expected)


def test_bad_batches_are_refused():
    with pytest.raises(ValueError, match=r"fixed field 'rewards' has shape \(2,\); it needs \[3, \.\.\.\]"):
        PackedBatch([1, 2, 3], [0, 0, 0], [1, 1, 1], {"rewards": torch.zeros(2)})
    with pytest.raises(ValueError, match="3 sample ids but 2 group ids"):
        PackedBatch([1, 2, 3], [0, 0], [1, 1, 1], {})
    with pytest.raises(ValueError, match="pass lengths, or a ragged field 'input_ids'"):
        PackedBatch.from_samples([1], [0], {"rewards": torch.zeros(1)})


def test_infos_travel_with_their_samples():
    tokens = [torch.arange(n) for n in (2, 3, 4)]
    batch = PackedBatch.from_samples(
        [7, 5, 9], [1, 1, 2], {"input_ids": tokens}, infos={5: "b", 7: "a", 9: "c", 4: "x"}
    )
    assert batch.infos == {7: "a", 5: "b", 9: "c"}  # only its own samples'
    assert batch.select([2, 0]).infos == {9: "c", 7: "a"} and batch.sorted_by_id().infos == batch.infos
    other = PackedBatch.from_samples([3], [0], {"input_ids": [torch.arange(1)]}, infos={3: "d"})
    assert PackedBatch.concat([batch, other]).infos == {7: "a", 5: "b", 9: "c", 3: "d"}
    bare = PackedBatch.from_samples([3], [0], {"input_ids": [torch.arange(1)]})
    assert bare.infos is None and PackedBatch.concat([batch, bare]).infos is None
    with pytest.raises(ValueError, match=r"infos lack sample ids \[9\]"):
        PackedBatch.from_samples([7, 9], [1, 2], {"input_ids": tokens[:2]}, infos={7: "a"})
