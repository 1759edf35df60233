"""The metadata encoding that the data coordinator's all-gather carries, and the placed layouts it plans over."""

import numpy as np
from data_cases import synthetic_batches

from distflow.coordination.data import PlacedLayout
from distflow.coordination.data.gather import decode_metadata, encode_metadata, table_from_payloads
from distflow.coordination.data.plan import SampleTable
from distflow.layout import ParallelLayout, Placement


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


def test_placed_layouts():
    placement = Placement.create("disaggregated", 8, 2, num_rollout_ranks=4)
    rollout = PlacedLayout.rollout(placement)
    assert rollout.holders == (4, 6) and rollout.dp_of(5) == 0 and rollout.dp_of(1) is None
    train = PlacedLayout.training(ParallelLayout.for_world(4, tp=2, pp=2), placement)
    assert train.holders == (2,) and train.dp_ranks(0) == (0, 1, 2, 3) and train.stage_of(3) == 1
    assert train.describe() == "tp=2 pp=2 dp=1 cp=1 on ranks 0..3"
