"""PromptLoader: disjoint deterministic partitions, batches over ranks, exact resume; validation batches."""

import pytest

from distflow.data import PromptLoader, epoch_order, val_batches

ROWS = list(range(23))  # the loader only indexes the dataset: plain ints stand in for prompts


def take(loader, n):
    return [next(loader) for _ in range(n)]


def test_ranks_partition_each_batch_and_epoch():
    world, batch = 4, 8
    loaders = [PromptLoader(ROWS, batch, rank=r, world_size=world, seed=5) for r in range(world)]
    assert loaders[0].steps_per_epoch == 2  # 23 // 8; the last 7 rows of each epoch are dropped
    for step in range(4):  # two epochs
        parts = [next(loader) for loader in loaders]
        assert all(len(p) == batch // world for p in parts)
        union = sorted(x for p in parts for x in p)
        assert len(set(union)) == batch  # disjoint
        order = epoch_order(len(ROWS), step // 2, seed=5)
        assert union == sorted(order[(step % 2) * batch : (step % 2 + 1) * batch])
        for r, p in enumerate(parts):  # rank r reads rows r::R of the epoch order
            assert p == order[r::world][(step % 2) * 2 : (step % 2 + 1) * 2]
    assert epoch_order(23, 0, 5) != epoch_order(23, 1, 5)  # reshuffled per epoch
    assert sorted(epoch_order(23, 1, 5)) == ROWS


def test_union_of_epoch_is_all_kept_rows():
    loaders = [PromptLoader(list(range(24)), 6, rank=r, world_size=3, seed=0) for r in range(3)]
    seen = [x for loader in loaders for batch in take(loader, 4) for x in batch]
    assert sorted(seen) == list(range(24))


def test_deterministic_and_seeded():
    a = take(PromptLoader(ROWS, 4, seed=1), 10)
    assert a == take(PromptLoader(ROWS, 4, seed=1), 10)
    assert a != take(PromptLoader(ROWS, 4, seed=2), 10)
    assert take(PromptLoader(ROWS, 4, shuffle=False), 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("stop_after", [1, 5, 6, 11])  # mid-epoch, at an epoch end, across epochs
def test_resume_yields_exactly_the_next_batches(stop_after):
    original = PromptLoader(ROWS, 4, rank=1, world_size=2, seed=3)
    expected = take(original, 20)
    first = PromptLoader(ROWS, 4, rank=1, world_size=2, seed=3)
    take(first, stop_after)
    resumed = PromptLoader(ROWS, 4, rank=1, world_size=2, seed=3)
    resumed.load_state_dict(first.state_dict())
    assert take(resumed, 20 - stop_after) == expected[stop_after:]


def test_resume_refuses_changed_data():
    state = PromptLoader(ROWS, 4).state_dict()
    with pytest.raises(ValueError, match="num_rows"):
        PromptLoader(ROWS[:-1], 4).load_state_dict(state)


def test_bad_sizes():
    with pytest.raises(ValueError, match="divisible"):
        PromptLoader(ROWS, 6, world_size=4)
    with pytest.raises(ValueError, match="larger than the dataset"):
        PromptLoader(ROWS, 32)


def test_val_batches_cover_everything_once():
    parts = [list(val_batches(ROWS, 10, rank=r, world_size=2)) for r in range(2)]
    assert [len(b) for b in parts[0]] == [5, 5, 2] and [len(b) for b in parts[1]] == [5, 5, 1]
    assert sorted(x for p in parts for b in p for x in b) == ROWS
