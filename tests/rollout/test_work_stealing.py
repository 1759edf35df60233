"""Work stealing's pure parts (chunking, whom to steal from) and its store protocol on an in-process c10d
HashStore (two boards in one process; the multi-process run with real engines is test_balanced_rollout.py)."""

import collections
import concurrent.futures

import pytest
from torch.distributed import HashStore

from distflow.workers.rollout.work_stealing import (
    SLOW_CLAIMS_ENV,
    Chunk,
    StoreBoard,
    choose_home,
    slow_claims_of,
    split_into_chunks,
)


def test_chunks_keep_consecutive_prompts_and_estimate_tokens():
    chunks = split_into_chunks(home=1, prompt_lens=[3, 5, 2, 7, 4], n=4, max_new_tokens=10, chunk_prompts=2)
    assert [(c.first_prompt, c.num_prompts) for c in chunks] == [(0, 2), (2, 2), (4, 1)]
    assert [c.index for c in chunks] == [0, 1, 2] and {c.home for c in chunks} == {1}
    # prompt tokens + n * max_new_tokens per prompt: (3 + 5) + 2 * 40, (2 + 7) + 80, 4 + 40
    assert [c.est_tokens for c in chunks] == [88, 89, 44]
    assert split_into_chunks(0, [], 4, 10, 2) == []
    with pytest.raises(ValueError, match="balance_chunk_prompts=0"):
        split_into_chunks(0, [1], 1, 1, 0)


def test_own_chunks_first_then_the_engine_with_most_unclaimed_tokens():
    plans = {0: [10, 10], 1: [50, 5, 5], 2: [30, 30]}
    assert choose_home(0, plans, {0: 1, 1: 0, 2: 0}) == 0  # own chunk left
    # own exhausted: unclaimed 1 -> 60, 2 -> 60: the tie goes to the lower index
    assert choose_home(0, plans, {0: 2, 1: 0, 2: 0}) == 1
    assert choose_home(0, plans, {0: 2, 1: 1, 2: 0}) == 2  # 1 -> 10, 2 -> 60: by tokens, not by chunk count
    assert choose_home(0, plans, {0: 2, 1: 3, 2: 2}) is None
    assert choose_home(1, {0: [], 1: []}, {}) is None


def test_slow_claims_hook_parses_and_names_the_variable(monkeypatch):
    monkeypatch.setenv(SLOW_CLAIMS_ENV, "1:2.5")
    assert slow_claims_of(1) == 2.5 and slow_claims_of(0) == 0.0
    monkeypatch.setenv(SLOW_CLAIMS_ENV, "one")
    with pytest.raises(ValueError, match=SLOW_CLAIMS_ENV):
        slow_claims_of(0)


def test_store_board_steals_and_sends_results_home():
    store = HashStore()
    prompts = {0: [[1], [2]], 1: [[3], [4], [5]]}
    boards = {e: StoreBoard(store, 0, e, 2, timeout_s=5) for e in (0, 1)}
    chunks = {e: split_into_chunks(e, [1] * len(prompts[e]), 2, 4, 1) for e in (0, 1)}
    for e in (0, 1):
        boards[e].publish(chunks[e], prompts[e])
    # engine 1 claims its first chunk, then engine 0 takes everything else (its own first, then 1's)
    first = boards[1].claim()
    assert first[0] == Chunk(1, 0, 0, 1, 9) and first[1] == [[3]]
    taken = []
    while (claim := boards[0].claim()) is not None:
        taken.append(claim)
    assert [(c.home, c.index, c.first_prompt, p) for c, p in taken] == [
        (0, 0, 0, [[1]]),
        (0, 1, 1, [[2]]),
        (1, 1, 1, [[4]]),
        (1, 2, 2, [[5]]),
    ]
    assert boards[1].claim() is None
    # "samples" stand in as strings: the board moves whatever the generator returned
    generated0 = {c: [f"sample of {c.home}/{c.index}"] for c, _ in taken}
    boards[0].post_results(generated0, generated_tokens=40)
    boards[1].post_results({first[0]: ["sample of 1/0"]}, generated_tokens=10)
    (mine0, totals0), (mine1, totals1) = boards[0].collect(), boards[1].collect()
    assert mine0 == {0: ["sample of 0/0"], 1: ["sample of 0/1"]}
    assert mine1 == {0: ["sample of 1/0"], 1: ["sample of 1/1"], 2: ["sample of 1/2"]}
    assert totals0 == totals1 == {"stolen_groups": 2, "engine_tokens": [40, 10]}
    # two rounds later each owner removes its round-0 keys
    StoreBoard(store, 2, 0, 2, timeout_s=5)
    assert not store.check(["distflow/rollout_balance/0/plan/0", "distflow/rollout_balance/0/prompts/0/1"])
    assert store.check(["distflow/rollout_balance/0/plan/1"])


def test_a_missing_engine_is_a_timeout_naming_what_was_awaited():
    store = HashStore()
    board = StoreBoard(store, 0, 0, 2, timeout_s=1)
    board.publish(split_into_chunks(0, [1], 1, 1, 1), [[1]])
    with pytest.raises(
        TimeoutError,
        match=r"chunk plans of every engine not there within 1 s \(rollout.balance_timeout_s, default trainer.dist_timeout_s",
    ):
        board.claim()


def test_partition_board_claims_only_its_own_chunks_but_shares_totals():
    store = HashStore()
    prompts = {0: [[1]], 1: [[3], [4]]}
    boards = {e: StoreBoard(store, 0, e, 2, timeout_s=5, steal=False) for e in (0, 1)}
    chunks = {e: split_into_chunks(e, [1] * len(prompts[e]), 1, 4, 1) for e in (0, 1)}
    for e in (0, 1):
        boards[e].publish(chunks[e], prompts[e])
    assert boards[0].claim() == (chunks[0][0], [[1]]) and boards[0].claim() is None  # 1's chunks stay 1's
    assert not store.check(["distflow/rollout_balance/0/prompts/1/0"])  # no prompts travel
    assert [boards[1].claim()[1] for _ in range(2)] == [[[3]], [[4]]] and boards[1].claim() is None
    boards[0].post_results({chunks[0][0]: ["a"]}, 4)
    boards[1].post_results({chunks[1][0]: ["b"], chunks[1][1]: ["c"]}, 8)
    assert boards[0].collect() == ({0: ["a"]}, {"stolen_groups": 0, "engine_tokens": [4, 8]})
    assert boards[1].collect() == ({0: ["b"], 1: ["c"]}, {"stolen_groups": 0, "engine_tokens": [4, 8]})


def test_a_dead_engines_chunks_are_adopted_and_its_results_still_come_home():
    store = HashStore()
    prompts = {0: [[1]], 1: [[3], [4], [5]]}
    boards = {e: StoreBoard(store, 0, e, 2, timeout_s=5, steal=False) for e in (0, 1)}
    chunks = {e: split_into_chunks(e, [1] * len(prompts[e]), 1, 4, 1) for e in (0, 1)}
    for e in (0, 1):
        boards[e].publish(chunks[e], prompts[e])
    # engine 1 finishes its first chunk, claims its second and dies generating it
    first, second = boards[1].claim(), boards[1].claim()
    boards[1].chunk_done()
    assert boards[1].abandon([second]) == 2  # the unfinished one and the unclaimed third
    # engine 0 (partition: it never steals) does its own, then adopts both orphans, then sees the round done
    assert boards[0].claim() == (chunks[0][0], [[1]]) and boards[0].claim() is None
    boards[0].chunk_done()
    adopted = [boards[0].claim_orphan(), boards[0].claim_orphan()]
    assert [(c.home, c.index, p) for c, p in adopted] == [(1, 1, [[4]]), (1, 2, [[5]])]
    with pytest.raises(TimeoutError, match="not all done"):  # adopted but not finished yet
        StoreBoard(store, 0, 0, 2, timeout_s=0.2).claim_orphan()
    boards[0].chunk_done(), boards[0].chunk_done()
    assert boards[0].claim_orphan() is None
    boards[1].wait_for_adopters()  # returns: every chunk is done
    boards[0].post_results({chunks[0][0]: ["a"], **{c: [f"s{c.index}"] for c, _ in adopted}}, 12)
    boards[1].post_results({first[0]: ["s0"]}, 4)
    assert boards[1].collect()[0] == {0: ["s0"], 1: ["s1"], 2: ["s2"]}
    assert boards[0].collect() == ({0: ["a"]}, {"stolen_groups": 2, "engine_tokens": [12, 4]})


def test_when_every_engine_died_nobody_waits_for_adopters():
    store = HashStore()
    boards = {e: StoreBoard(store, 0, e, 2, timeout_s=30) for e in (0, 1)}
    for e in (0, 1):
        boards[e].publish(split_into_chunks(e, [1], 1, 4, 1), [[e]])
    for e in (0, 1):
        boards[e].abandon([])
    with pytest.raises(RuntimeError, match="every engine of the step died"):
        boards[0].wait_for_adopters()


class CountingStore:
    """A HashStore that counts the board's store calls by name."""

    def __init__(self):
        self.inner, self.calls = HashStore(), collections.Counter()

    def __getattr__(self, name):
        method = getattr(self.inner, name)

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return method(*args, **kwargs)

        return counted


def _two_boards_with_engine_1_still_generating(store):
    boards = {e: StoreBoard(store, 0, e, 2, timeout_s=30, steal=False) for e in (0, 1)}
    for e in (0, 1):
        boards[e].publish(split_into_chunks(e, [1], 1, 4, 1), [[e]])
    for e in (0, 1):
        assert boards[e].claim() is not None
    boards[0].chunk_done()  # engine 0 is done; engine 1's chunk is still generating
    return boards


def test_an_engine_waiting_for_the_round_makes_one_store_wait_until_the_last_chunk_is_done():
    # Polling with short waits made c10d log "waitForInput ... timed out after 200ms" every 200 ms per
    # waiting rank; one wait, answered when the round is done, logs nothing and wakes at once.
    store = CountingStore()
    boards = _two_boards_with_engine_1_still_generating(store)
    store.calls.clear()
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(boards[0].claim_orphan)
    with pytest.raises(concurrent.futures.TimeoutError):
        waiting.result(timeout=0.6)  # engine 1 is still generating: engine 0 waits
    assert store.calls["wait"] == 1  # one wait for the round's next event, not one per poll
    boards[1].chunk_done()  # the round's last chunk
    assert waiting.result(timeout=10) is None


def test_an_engine_waiting_for_the_round_wakes_for_an_orphan_posted_meanwhile():
    store = CountingStore()
    boards = _two_boards_with_engine_1_still_generating(store)
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(boards[0].claim_orphan)
    with pytest.raises(concurrent.futures.TimeoutError):
        waiting.result(timeout=0.3)
    unfinished = Chunk(1, 0, 0, 1, 5)
    assert boards[1].abandon([(unfinished, [[1]])]) == 1  # engine 1 dies with its chunk unfinished
    adopted = waiting.result(timeout=10)
    assert adopted == (unfinished, [[1]])
    # the dead engine waits for its adopter the same way, and is woken by the adopted chunk's end
    dead_waits = concurrent.futures.ThreadPoolExecutor(1).submit(boards[1].wait_for_adopters)
    boards[0].chunk_done()
    assert dead_waits.result(timeout=10) is None
