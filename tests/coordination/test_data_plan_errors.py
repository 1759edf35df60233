"""Metadata that does not fit the plan is an error naming the node, the key (sample, group or field) and
the rank, on every rank alike (the plan is computed from the same table everywhere)."""

import pytest
import torch
from data_cases import FIELDS, synthetic_batches

from distflow.coordination.data import (
    DataPlanError,
    FieldPlacement,
    PackedBatch,
    PlacedLayout,
    SampleTable,
    plan_redistribution,
)
from distflow.layout import ParallelLayout, Placement

PLACEMENT = Placement.create("colocated", 4, 1)
ROLLOUT = PlacedLayout.rollout(PLACEMENT)
TRAIN = PlacedLayout.training(ParallelLayout(tp=2, dp=2), PLACEMENT)


def _plan(batches, fields=FIELDS, keep_groups=True, producer=ROLLOUT):
    return plan_redistribution(
        producer,
        TRAIN,
        SampleTable.from_batches(batches),
        fields,
        keep_groups=keep_groups,
        node="train_actor",
    )


def _replace(batch: PackedBatch, **changes) -> PackedBatch:
    fields = {**batch.fields, **changes.pop("fields", {})}
    row_counts = {n: c for n, c in batch.row_counts.items() if n in fields}
    row_counts.update(changes.pop("row_counts", {}))
    return PackedBatch(
        changes.get("sample_ids", batch.sample_ids),
        changes.get("groups", batch.groups),
        batch.lengths,
        fields,
        row_counts,
    )


def _expect(match, key, rank, **kwargs):
    with pytest.raises(DataPlanError, match=match) as info:
        _plan(**kwargs)
    assert str(info.value).startswith("node 'train_actor': ")
    assert (info.value.node, info.value.key, info.value.rank) == ("train_actor", key, rank)


def test_group_split_over_ranks_with_keep_groups():
    batches = synthetic_batches(ROLLOUT, 8, 4, seed=3)
    g = int(batches[0].groups[0])
    batches[2] = _replace(batches[2], groups=torch.full_like(batches[2].groups, g))
    with pytest.raises(
        DataPlanError,
        match=rf"node 'train_actor': group {g} is split over ranks \[0, 2\] "
        r"\(sample \d+ on rank [02]\).*are group ids unique",
    ) as info:
        _plan(batches)
    assert (info.value.key, info.value.rank in (0, 2)) == (g, True)
    _plan(batches, keep_groups=False)  # splitting groups is fine when the node does not need them whole


def test_duplicate_sample_id():
    batches = synthetic_batches(ROLLOUT, 8, 4, seed=3)
    sid = int(batches[1].sample_ids[0])
    ids = batches[3].sample_ids.clone()
    ids[0] = sid
    batches[3] = _replace(batches[3], sample_ids=ids)
    _expect(rf"sample {sid} appears 2 times, on ranks \[1, 3\]", sid, 3, batches=batches)


def test_missing_field():
    batches = synthetic_batches(ROLLOUT, 8, 4, seed=3)
    b = batches[2]
    batches[2] = PackedBatch(
        b.sample_ids,
        b.groups,
        b.lengths,
        {n: t for n, t in b.fields.items() if n != "advantages"},
        {n: c for n, c in b.row_counts.items() if n != "advantages"},
    )
    _expect(r"rank 2 has no field 'advantages', which the consumer needs", "advantages", 2, batches=batches)


def test_field_without_a_stage_rule():
    batches = synthetic_batches(ROLLOUT, 8, 4, seed=3)
    b = batches[1]
    batches[1] = _replace(b, fields={"values": torch.zeros(b.num_tokens)}, row_counts={"values": b.lengths})
    _expect(
        r"field 'values' from rank 1 has no stage rule; add it to the FieldPlacement",
        "values",
        1,
        batches=batches,
    )


@pytest.mark.parametrize(
    "bad, described",
    [
        (
            lambda b: b.fields["old_logprobs"].to(torch.float64),
            r"float64\[ragged\] on rank 3 but float32\[ragged\] on rank 0",
        ),
        (
            lambda b: b.fields["old_logprobs"].reshape(-1, 1),
            r"float32\[ragged, 1\] on rank 3 but float32\[ragged\]",
        ),
    ],
)
def test_inconsistent_field_shapes(bad, described):
    batches = synthetic_batches(ROLLOUT, 8, 4, seed=3)
    batches[3] = _replace(batches[3], fields={"old_logprobs": bad(batches[3])})
    _expect(rf"field 'old_logprobs' is {described}", "old_logprobs", 3, batches=batches)


def test_fixed_versus_ragged_field():
    batches = synthetic_batches(ROLLOUT, 8, 4, seed=3)
    b = batches[1]
    fields = {**b.fields, "rewards": torch.zeros(b.num_tokens)}
    batches[1] = PackedBatch(
        b.sample_ids, b.groups, b.lengths, fields, {**b.row_counts, "rewards": b.lengths}
    )
    _expect(
        r"field 'rewards' is float32\[ragged\] on rank 1 but float32\[fixed\] on rank 0",
        "rewards",
        1,
        batches=batches,
    )


def test_samples_on_a_rank_that_is_not_a_holder():
    producer = PlacedLayout.training(ParallelLayout(tp=2, dp=2), PLACEMENT)
    batches = synthetic_batches(producer, 8, 4, seed=3)
    batches[1] = batches.pop(2)  # rank 1 is tp rank 1 of DP group 0
    with pytest.raises(
        DataPlanError,
        match=r"rank 1 holds samples \(sample \d+ among them\) but is not a holder "
        r"of the producer layout .*: \[0, 2\]",
    ) as info:
        _plan(batches, producer=PlacedLayout(producer.layout, producer.ranks, replicated=False))
    assert info.value.rank == 1


def test_ragged_rows_must_match_the_data():
    b = max(synthetic_batches(ROLLOUT, 2, 2, seed=3).values(), key=len)
    with pytest.raises(
        ValueError, match=r"ragged field 'input_ids' has \d+ rows but its \d+ row counts sum to"
    ):
        PackedBatch(b.sample_ids, b.groups, b.lengths, b.fields, {**b.row_counts, "input_ids": b.lengths + 1})


def test_field_placement_rules():
    with pytest.raises(ValueError, match="field 'x': stage 'middle' is not one of"):
        FieldPlacement({"x": "middle"})
    with pytest.raises(KeyError, match=r"no standard stage rule for fields \['logits'\]"):
        FieldPlacement.standard("input_ids", "logits")
    rules = FieldPlacement.standard("input_ids", "advantages", "attention_mask", extra="last")
    assert rules.fields_for_stage(0, 3) == ("attention_mask", "input_ids")
    assert rules.fields_for_stage(1, 3) == ("attention_mask",)
    assert rules.fields_for_stage(2, 3) == ("advantages", "attention_mask", "extra")
    assert rules.fields_for_stage(0, 1) == ("advantages", "attention_mask", "extra", "input_ids")
