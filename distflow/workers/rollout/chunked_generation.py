"""Generates claimed chunks on one engine, several in flight, until its board has nothing left to claim.

Who calls: RolloutWorker.generate on engine owners (rollout with more than one engine). The board
(work_stealing.LocalBoard or StoreBoard) decides which chunk comes next; this module keeps the engine busy:
it claims while the estimated tokens of claimed-but-unfinished chunks are under the budget (always at least
one chunk), so balancing is by outstanding tokens and SGLang's continuous batching still sees many requests.
Where seeded samples depend on their batch mates (sglang_engine.sampling_depends_on_batch: the CPU stand-in),
one chunk is in flight at a time, so a chunk's samples are the same whichever engine generates it.
"""

import asyncio
from dataclasses import dataclass, field

from distflow.workers.rollout import engine_health, sglang_engine
from distflow.workers.rollout.engine_health import EngineDiedError


@dataclass
class ChunkRun:
    generated: dict = field(default_factory=dict)
    """chunk -> its samples, prompt-major, prompt_index counted in the home's partition"""
    peak_in_flight: int = 0  # most chunks in flight at once
    unfinished: list = field(default_factory=list)
    """(chunk, prompts) claimed here and not finished when the engine died"""
    died: EngineDiedError | None = None
    """Set when the engine died mid-run (with adopt_orphans: the caller hands `unfinished` to the others)."""

    @property
    def tokens(self) -> int:
        """Response tokens generated here."""
        return sum(len(s.response_ids) for samples in self.generated.values() for s in samples)


def generate_claimed_chunks(
    engine,
    board,
    seed_of_home,
    budget_tokens: int,
    on_chunk=None,
    adopt_orphans: bool = False,
    generate_fn=sglang_engine.generate_async,
    **sampling,
) -> ChunkRun:
    """Runs chunks from `board.claim()` on `engine` until it returns None.

    seed_of_home(home engine) -> the call seed of that home's partition (seed_of_home None: unseeded), so a
    sample's seed does not depend on the engine that generates it. on_chunk(chunk, samples): called as each
    chunk finishes, while others still generate (streaming). `sampling`: sglang_engine.generate's n,
    temperature, top_p, top_k, max_new_tokens, stop_token_ids, stop.
    adopt_orphans (engines may be restarted): every finished chunk is counted on the board, and once nothing
    is left to claim this engine adopts dead engines' orphans (board.claim_orphan) until the round is done;
    if this engine dies, the run returns with `died` and `unfinished` set instead of raising. Without it,
    engine death raises EngineDiedError.
    generate_fn: sglang_engine.generate_async, or a multi-turn TrajectoryRunner's (the board then holds
    TrajectoryPrompts, which it passes on as they are).
    """
    # Unseeded samples do not depend on their batch mates' seeds; seeded ones may (see the module doc).
    one_at_a_time = seed_of_home is not None and sglang_engine.sampling_depends_on_batch(engine)
    result = ChunkRun()
    pending: dict = {}  # task -> (chunk, prompts); what is left in it when the engine dies is unfinished

    def start(chunk, prompts) -> int:
        seed = None if seed_of_home is None else seed_of_home(chunk.home)
        task = asyncio.ensure_future(
            generate_fn(engine, prompts, seed=seed, first_prompt_index=chunk.first_prompt, **sampling)
        )
        pending[task] = (chunk, prompts)
        result.peak_in_flight = max(result.peak_in_flight, len(pending))
        return chunk.est_tokens

    async def run() -> None:
        outstanding, exhausted = 0, False
        try:
            while True:
                while not exhausted and (not pending or (not one_at_a_time and outstanding < budget_tokens)):
                    claimed = board.claim()
                    if claimed is None:
                        exhausted = True
                        break
                    outstanding += start(*claimed)
                if not pending:
                    # Nothing in flight, so blocking the loop while waiting for an orphan stalls nothing.
                    orphan = board.claim_orphan() if adopt_orphans else None
                    if orphan is None:
                        return
                    outstanding += start(*orphan)
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    chunk, _ = pending.pop(task)
                    outstanding -= chunk.est_tokens
                    result.generated[chunk] = task.result()
                    if adopt_orphans:
                        board.chunk_done()
                    if on_chunk is not None:
                        on_chunk(chunk, result.generated[chunk])
        finally:
            for task in pending:
                task.cancel()

    try:
        engine_health.call(engine, "generate", engine.loop.run_until_complete, run())
    except EngineDiedError as exc:
        if not adopt_orphans:
            raise
        result.died, result.unfinished = exc, list(pending.values())
    return result
