"""Work stealing among rollout engines, without a dispatcher: chunks, claims in the job's store, results home.

Every engine owner splits its own partition of the step's prompts into chunks (consecutive prompt groups:
the n samples of a prompt stay together) and publishes them (estimated tokens and prompt ids) in the job's
c10d store. Chunks are claimed with one atomic counter per home engine (`store.add(key, 1)` returns the claim
order, so each chunk goes to exactly one claimer): an owner claims its own chunks first, then those of the
engine with the most unclaimed estimated tokens. A stolen chunk's samples are posted to the store and read
back by their home owner, so everything downstream of rollout sees only its own partition.

Pure parts (chunking, the choice of whom to steal from) are functions; `StoreBoard` is the store protocol.
Under balance=partition (steal=False) an owner claims only its own chunks, and the store carries just the
plans and the per-engine totals (the step's metrics); a single engine uses no board at all.
Keys are namespaced per generation round (every owner calls generate the same number of times) and each
owner deletes its keys two rounds later, when every owner is certainly past that round.

An engine that dies mid-round (its owner rank lives on: rollout.engine_restarts) abandons its claimed but
unfinished chunks and its unclaimed own ones as orphans: numbered slots in the store that a live engine
adopts with one atomic counter per slot, and generates with the chunk's home seeds, so the round's samples
are the ones it would have had. Every finished chunk is counted (`done`); a live engine looks for orphans
until the round's every chunk is done, so no orphan is left behind by engines that finished first. It
waits for the round's events (numbered keys: the round done, an engine dead and its orphans posted) with
one store wait each, answered when the event is posted, on a store client of its own
(distributed/store_client.py) so that the wait holds no other user of the store. When
every engine of the round is dead, nobody can adopt: the dead owners raise EveryEngineDied (in lock-step
every rank then regenerates its partition in place, nodes/rollout.py; otherwise the job stops).

Test/fault hook: DISTFLOW_FAULT_SLOW_CLAIMS="<engine>:<seconds>" makes that engine wait before each of its
claims, up to <seconds>, returning early once every chunk of the round is claimed (a slow engine whose work
the others take; the early return keeps tests fast and their outcome independent of machine load).
"""

import datetime
import os
import pickle
import time
from dataclasses import dataclass

SLOW_CLAIMS_ENV = "DISTFLOW_FAULT_SLOW_CLAIMS"


@dataclass(frozen=True)
class Chunk:
    """Prompts first_prompt .. first_prompt + num_prompts - 1 of engine `home`'s partition, with all their samples."""

    home: int
    index: int  # position in the home's chunk list, which is the claim order
    first_prompt: int
    num_prompts: int
    est_tokens: int  # prompt tokens + n * max_new_tokens per prompt: an upper bound of the chunk's KV tokens


def split_into_chunks(
    home: int, prompt_lens: list[int], n: int, max_new_tokens: int, chunk_prompts: int
) -> list[Chunk]:
    """The home engine's partition as chunks of `chunk_prompts` consecutive prompts (the last may be smaller)."""
    if chunk_prompts < 1:
        raise ValueError(f"rollout.balance_chunk_prompts={chunk_prompts} must be >= 1")
    chunks = []
    for index, first in enumerate(range(0, len(prompt_lens), chunk_prompts)):
        lens = prompt_lens[first : first + chunk_prompts]
        chunks.append(Chunk(home, index, first, len(lens), sum(lens) + len(lens) * n * max_new_tokens))
    return chunks


def unclaimed_tokens(plan: list[int], claimed: int) -> int:
    """Estimated tokens of a home's chunks not claimed yet (claims take chunks in list order)."""
    return sum(plan[claimed:])


def choose_home(me: int, plans: dict[int, list[int]], claimed: dict[int, int]) -> int | None:
    """Whose chunk to claim next: my own while any is unclaimed, else the engine with the most unclaimed
    estimated tokens (the lowest index on a tie); None when every chunk is claimed.
    plans: engine -> estimated tokens of its chunks; claimed: engine -> chunks claimed so far."""
    if claimed.get(me, 0) < len(plans.get(me, ())):
        return me
    left = {e: unclaimed_tokens(plan, claimed.get(e, 0)) for e, plan in plans.items()}
    best = max(sorted(left), key=lambda e: left[e], default=None)  # max keeps the first (lowest) on ties
    return best if best is not None and left[best] > 0 else None


def slow_claims_of(engine: int) -> float:
    """Seconds engine `engine` waits before each claim under the fault hook (0 without it)."""
    spec = os.environ.get(SLOW_CLAIMS_ENV, "")
    if not spec:
        return 0.0
    try:
        who, seconds = spec.split(":")
        return float(seconds) if int(who) == engine else 0.0
    except ValueError:
        raise ValueError(
            f"{SLOW_CLAIMS_ENV}={spec!r}: expected '<engine index>:<seconds>', e.g. '1:60'"
        ) from None


class EveryEngineDied(RuntimeError):
    """Every engine of a balanced round died (each was restarted by its owner): nobody adopts the orphans."""


class StoreBoard:
    """One round of claims among `num_engines` owners through the c10d `store`; every wait is bounded by
    `timeout_s` and names what it waited for. steal=False: only my own chunks (balance=partition)."""

    def __init__(
        self, store, round_index: int, me: int, num_engines: int, timeout_s: float, steal: bool = True
    ):
        self.store, self.round, self.me, self.num_engines = store, round_index, me, num_engines
        self.steal = steal
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.plans: dict[int, list[int]] = {}
        self.claimed: dict[int, int] = {}  # last counter values seen (claims only ever grow)
        self.slow_s = slow_claims_of(me)
        self._orphans_seen = 0  # orphan slots this engine has looked at (they are only ever appended)
        self._events_seen = 0  # the round's events (_post_event) this engine has woken for
        self._delete_round(round_index - 2)

    def key(self, *parts, round_index: int | None = None) -> str:
        return "/".join(
            [
                "distflow/rollout_balance",
                str(self.round if round_index is None else round_index),
                *map(str, parts),
            ]
        )

    def publish(self, chunks: list[Chunk], prompt_ids: list[list[int]]) -> None:
        """Makes my chunks claimable: their prompts first, then the plan (which others wait for)."""
        self._own = chunks
        self._own_prompts = [prompt_ids[c.first_prompt : c.first_prompt + c.num_prompts] for c in chunks]
        for c in chunks if self.steal else ():
            self.store.set(
                self.key("prompts", self.me, c.index),
                pickle.dumps((c.first_prompt, prompt_ids[c.first_prompt : c.first_prompt + c.num_prompts])),
            )
        self.store.set(self.key("plan", self.me), pickle.dumps([c.est_tokens for c in chunks]))

    def _wait(self, keys: list[str], what: str) -> None:
        try:
            self.store.wait(keys, self.timeout)
        except Exception as exc:  # the store raises a generic DistStoreError/RuntimeError on timeout
            raise TimeoutError(
                f"rollout balance (engine {self.me}, round {self.round}): {what} not there within "
                f"{self.timeout_s:g} s (rollout.balance_timeout_s, default trainer.dist_timeout_s: a frozen or "
                f"dead engine rank stops the job there) ({exc})"
            ) from exc

    def _read_plans(self) -> None:
        if len(self.plans) == self.num_engines:
            return
        keys = [self.key("plan", e) for e in range(self.num_engines)]
        self._wait(keys, "the chunk plans of every engine")
        self.plans = {e: pickle.loads(self.store.get(k)) for e, k in enumerate(keys)}

    def _refresh_claims(self) -> None:
        for e in range(self.num_engines):
            self.claimed[e] = int(self.store.add(self.key("claims", e), 0))

    def _all_claimed(self) -> bool:
        self._refresh_claims()
        return all(self.claimed[e] >= len(self.plans[e]) for e in self.plans)

    def _slow_down(self) -> None:
        deadline = time.monotonic() + self.slow_s
        while time.monotonic() < deadline and not self._all_claimed():
            time.sleep(0.2)

    def claim(self) -> tuple[Chunk, list[list[int]]] | None:
        """The next chunk for me and its prompts; None once every chunk of the round is claimed."""
        self._read_plans()
        if self.slow_s:
            self._slow_down()
        self._refresh_claims()
        plans = self.plans if self.steal else {self.me: self.plans[self.me]}
        while (home := choose_home(self.me, plans, self.claimed)) is not None:
            index = int(self.store.add(self.key("claims", home), 1)) - 1
            self.claimed[home] = index + 1
            if index < len(self.plans[home]) and home == self.me:  # my own: no need to read the store
                return self._own[index], self._own_prompts[index]
            if index < len(self.plans[home]):
                first, prompts = pickle.loads(self.store.get(self.key("prompts", home, index)))
                return Chunk(home, index, first, len(prompts), self.plans[home][index]), prompts
        return None

    # ---- a dead engine's chunks ------------------------------------------------------------------------

    def chunk_done(self) -> None:
        """Counts one finished chunk of the round (any home, any engine); the last one marks the round done."""
        self._read_plans()
        if int(self.store.add(self.key("done"), 1)) == self._total_chunks():
            self.store.set(self.key("settled"), b"1")
            self._post_event()

    def _total_chunks(self) -> int:
        return sum(len(plan) for plan in self.plans.values())

    def abandon(self, unfinished: list[tuple[Chunk, list[list[int]]]]) -> int:
        """My engine died: posts `unfinished` (claimed, not done) and my own unclaimed chunks as orphans, and
        declares me dead; returns how many chunks it gave away."""
        self._read_plans()
        orphans = list(unfinished)
        while (index := int(self.store.add(self.key("claims", self.me), 1)) - 1) < len(self.plans[self.me]):
            orphans.append((self._own[index], self._own_prompts[index]))
        for chunk, prompts in orphans:
            slot = int(self.store.add(self.key("orphan_count"), 1)) - 1
            self.store.set(self.key("orphan", slot), pickle.dumps((chunk, prompts)))
        self.store.add(self.key("dead"), 1)
        self._post_event()
        return len(orphans)

    def _settled(self) -> bool:
        """Whether every chunk of the round is done."""
        return self.store.check([self.key("settled")]) or self._total_chunks() == 0

    def _post_event(self) -> None:
        """Wakes the engines waiting on the round (_await_event): the round is done, or an engine died and
        left orphans. Events are numbered keys, so a waiter that looks late still finds each one."""
        self.store.set(self.key("event", int(self.store.add(self.key("events"), 1)) - 1), b"")

    def _await_event(self, deadline: float, timeout_message: str) -> None:
        """Until the round's next event this board has not seen, or TimeoutError(timeout_message) at
        `deadline` (time.monotonic). One wait in the store, answered when the event is posted: no polling
        (worker.py gives the board a store client of its own, so the wait holds no other user of the store)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(timeout_message)
        try:
            self.store.wait([self.key("event", self._events_seen)], datetime.timedelta(seconds=left))
        except Exception as exc:  # the store raises a generic DistStoreError/RuntimeError on timeout
            raise TimeoutError(timeout_message) from exc
        self._events_seen += 1

    def claim_orphan(self) -> tuple[Chunk, list[list[int]]] | None:
        """A live engine, its own claims exhausted: the next orphan it adopts, waiting (bounded) while chunks
        are still being generated elsewhere, since an engine may yet die and leave some; None once every chunk
        of the round is done."""
        self._read_plans()
        deadline = time.monotonic() + self.timeout_s
        while True:
            posted = int(self.store.add(self.key("orphan_count"), 0))
            while self._orphans_seen < posted:
                slot = self._orphans_seen
                self._orphans_seen += 1
                if int(self.store.add(self.key("orphan_claim", slot), 1)) == 1:  # the first claim wins
                    key = self.key("orphan", slot)
                    self._wait([key], f"orphan chunk {slot}")  # numbered before it is written
                    return pickle.loads(self.store.get(key))
            if self._settled():
                return None
            self._await_event(
                deadline,
                f"rollout balance (engine {self.me}, round {self.round}): the round's chunks not all done "
                f"within {self.timeout_s:g} s (rollout.balance_timeout_s, default trainer.dist_timeout_s: "
                "a frozen engine rank stops the job there)",
            )

    def wait_for_adopters(self) -> None:
        """A dead engine, after abandon(): until every chunk of the round is done by the live engines; raises
        EveryEngineDied at once if none is left alive to adopt the orphans."""
        deadline = time.monotonic() + self.timeout_s
        while not self._settled():
            if int(self.store.add(self.key("dead"), 0)) >= self.num_engines:
                raise EveryEngineDied(
                    f"rollout balance (round {self.round}): every engine of the step died; none is left to "
                    "generate the unfinished chunks"
                )
            self._await_event(
                deadline,
                f"rollout balance (engine {self.me}, round {self.round}): my orphaned chunks not generated "
                f"by another engine within {self.timeout_s:g} s (rollout.balance_timeout_s)",
            )

    def finish(self, generated: dict[Chunk, list], generated_tokens: int) -> tuple[dict[int, list], dict]:
        """post_results, then collect."""
        self.post_results(generated, generated_tokens)
        return self.collect()

    def post_results(self, generated: dict[Chunk, list], generated_tokens: int) -> None:
        """Posts the stolen chunks' samples for their homes, and my totals (groups stolen, tokens generated);
        keeps my own chunks' samples for collect."""
        self._mine = {c.index: s for c, s in generated.items() if c.home == self.me}
        stolen = [c for c in generated if c.home != self.me]
        for c in stolen:
            self.store.set(self.key("result", c.home, c.index), pickle.dumps(generated[c]))
        self.store.set(
            self.key("totals", self.me), pickle.dumps((sum(c.num_prompts for c in stolen), generated_tokens))
        )

    def collect(self) -> tuple[dict[int, list], dict]:
        """(my chunks' samples by chunk index, the round's totals over every engine), once my chunks generated
        elsewhere and every engine's totals are in the store."""
        self._read_plans()
        mine = dict(self._mine)
        away = [i for i in range(len(self.plans[self.me])) if i not in mine]
        if away:
            keys = [self.key("result", self.me, i) for i in away]
            self._wait(keys, f"the samples of my chunks {away} generated by other engines")
            for i, k in zip(away, keys):
                mine[i] = pickle.loads(self.store.get(k))
                self.store.delete_key(k)
        keys = [self.key("totals", e) for e in range(self.num_engines)]
        self._wait(keys, "every engine's generation totals")
        totals = [pickle.loads(self.store.get(k)) for k in keys]
        return mine, {"stolen_groups": sum(t[0] for t in totals), "engine_tokens": [t[1] for t in totals]}

    def _delete_round(self, round_index: int) -> None:
        """My keys of an old round (its results were deleted when read)."""
        if round_index < 0 or not self.store.check([self.key("plan", self.me, round_index=round_index)]):
            return
        plan = pickle.loads(self.store.get(self.key("plan", self.me, round_index=round_index)))
        old = [
            k
            for i in range(len(plan))
            if self.store.check([k := self.key("prompts", self.me, i, round_index=round_index)])
        ]
        old += [self.key(kind, self.me, round_index=round_index) for kind in ("claims", "totals", "plan")]
        if self.me == 0:  # the round's shared keys: engine 0 deletes them
            orphans = int(self.store.add(self.key("orphan_count", round_index=round_index), 0))
            old += [self.key("orphan", i, round_index=round_index) for i in range(orphans)]
            old += [self.key("orphan_claim", i, round_index=round_index) for i in range(orphans)]
            events = int(self.store.add(self.key("events", round_index=round_index), 0))
            old += [self.key("event", i, round_index=round_index) for i in range(events)]
            old += [
                self.key(k, round_index=round_index)
                for k in ("orphan_count", "done", "dead", "settled", "events")
            ]
        for k in old:
            self.store.delete_key(k)
