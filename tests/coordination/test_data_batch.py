"""PackedBatch (ragged and fixed fields), the run copier behind packing and unpacking, and the metadata
encoding that the all-gather carries."""
import numpy as np
import pytest
import torch

from data_cases import synthetic_batches
from distflow.coordination.data import FieldSchema, PackedBatch, PlacedLayout
from distflow.coordination.data.batch import copy_runs, row_index
from distflow.coordination.data.gather import decode_metadata, encode_metadata, table_from_payloads
from distflow.coordination.data.plan import SampleTable
from distflow.layout import ParallelLayout, Placement


def _batch():
    return PackedBatch.from_samples([7, 3, 5], [1, 0, 1], {
        "input_ids": [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])],
        "rewards": torch.tensor([0.5, -1.0, 2.0])})


def test_ragged_and_fixed_fields():
    b = _batch()
    assert b.lengths.tolist() == [3, 1, 2] and b.num_tokens == 6
    assert b.schema() == {"input_ids": FieldSchema(torch.int64), "rewards": FieldSchema(torch.float32, (), False)}
    assert b.sample(2)["input_ids"].tolist() == [5, 6] and float(b.sample(1)["rewards"]) == -1.0
    s = b.sorted_by_id()
    assert s.sample_ids.tolist() == [3, 5, 7]
    assert s.fields["input_ids"].tolist() == [4, 5, 6, 1, 2, 3] and s.fields["rewards"].tolist() == [-1.0, 2.0, 0.5]
    assert s.select([2, 0], ["input_ids"]).equals(PackedBatch.from_samples(
        [7, 3], [1, 0], {"input_ids": [torch.tensor([1, 2, 3]), torch.tensor([4])]}))
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
        expected = torch.cat([src[s:s + n] for s, n in zip(src_starts, counts)]) if counts.sum() else dst
        assert torch.equal(dst, expected)


def test_metadata_round_trip():
    producer = PlacedLayout.rollout(Placement.create("colocated", 4, 1))
    batches = synthetic_batches(producer, 10, 3, seed=2)
    payloads = {r: encode_metadata(b) for r, b in batches.items()}
    payloads[7] = encode_metadata(None)
    schema, ragged, matrix = decode_metadata(payloads[0])
    assert schema == batches[0].schema() and ragged == sorted(batches[0].row_counts)
    table = table_from_payloads(payloads)
    direct = SampleTable.from_batches(batches)
    for name in ("sample_ids", "groups", "lengths", "holders"):
        assert np.array_equal(getattr(table, name), getattr(direct, name))
    assert table.rows.keys() == direct.rows.keys()
    assert all(np.array_equal(table.rows[n], direct.rows[n]) for n in table.rows)
    assert table.schemas == direct.schemas


def test_bad_batches_are_refused():
    with pytest.raises(ValueError, match=r"fixed field 'rewards' has shape \(2,\); it needs \[3, \.\.\.\]"):
        PackedBatch([1, 2, 3], [0, 0, 0], [1, 1, 1], {"rewards": torch.zeros(2)})
    with pytest.raises(ValueError, match="3 sample ids but 2 group ids"):
        PackedBatch([1, 2, 3], [0, 0], [1, 1, 1], {})
    with pytest.raises(ValueError, match="pass lengths, or a ragged field 'input_ids'"):
        PackedBatch.from_samples([1], [0], {"rewards": torch.zeros(1)})


def test_infos_travel_with_their_samples():
    tokens = [torch.arange(n) for n in (2, 3, 4)]
    batch = PackedBatch.from_samples([7, 5, 9], [1, 1, 2], {"input_ids": tokens}, infos={5: "b", 7: "a", 9: "c", 4: "x"})
    assert batch.infos == {7: "a", 5: "b", 9: "c"}  # only its own samples'
    assert batch.select([2, 0]).infos == {9: "c", 7: "a"} and batch.sorted_by_id().infos == batch.infos
    other = PackedBatch.from_samples([3], [0], {"input_ids": [torch.arange(1)]}, infos={3: "d"})
    assert PackedBatch.concat([batch, other]).infos == {7: "a", 5: "b", 9: "c", 3: "d"}
    bare = PackedBatch.from_samples([3], [0], {"input_ids": [torch.arange(1)]})
    assert bare.infos is None and PackedBatch.concat([batch, bare]).infos is None
    with pytest.raises(ValueError, match=r"infos lack sample ids \[9\]"):
        PackedBatch.from_samples([7, 9], [1, 2], {"input_ids": tokens[:2]}, infos={7: "a"})


def test_placed_layouts():
    placement = Placement.create("disaggregated", 8, 2, num_rollout_ranks=4)
    rollout = PlacedLayout.rollout(placement)
    assert rollout.holders == (4, 6) and rollout.dp_of(5) == 0 and rollout.dp_of(1) is None
    train = PlacedLayout.training(ParallelLayout.for_world(4, tp=2, pp=2), placement)
    assert train.holders == (2,) and train.dp_ranks(0) == (0, 1, 2, 3) and train.stage_of(3) == 1
    assert train.describe() == "tp=2 pp=2 dp=1 cp=1 on ranks 0..3"
