"""Generates claimed chunks on one engine, several in flight, until its board has nothing left to claim.

Who calls: RolloutWorker.generate on engine owners (rollout with more than one engine). The board
(work_stealing.LocalBoard or StoreBoard) decides which chunk comes next; this module keeps the engine busy:
it claims while the estimated tokens of claimed-but-unfinished chunks are under the budget (always at least
one chunk), so balancing is by outstanding tokens and SGLang's continuous batching still sees many requests.
Where seeded samples depend on their batch mates (sglang_engine.sampling_depends_on_batch: the CPU stand-in),
one chunk is in flight at a time, so a chunk's samples are the same whichever engine generates it.
"""

import asyncio
from dataclasses import dataclass

from distflow.workers.rollout import engine_health, sglang_engine


@dataclass
class ChunkRun:
    generated: dict  # chunk -> its samples, prompt-major, prompt_index counted in the home's partition
    tokens: int  # response tokens generated here
    peak_in_flight: int  # most chunks in flight at once


def generate_claimed_chunks(
    engine, board, seed_of_home, budget_tokens: int, on_chunk=None, **sampling
) -> ChunkRun:
    """Runs chunks from `board.claim()` on `engine` until it returns None.

    seed_of_home(home engine) -> the call seed of that home's partition (seed_of_home None: unseeded), so a
    sample's seed does not depend on the engine that generates it. on_chunk(chunk, samples): called as each
    chunk finishes, while others still generate (streaming). `sampling`: sglang_engine.generate's n,
    temperature, top_p, top_k, max_new_tokens, stop_token_ids, stop. Engine death: EngineDiedError.
    """
    peak = 0
    # Unseeded samples do not depend on their batch mates' seeds; seeded ones may (see the module doc).
    one_at_a_time = seed_of_home is not None and sglang_engine.sampling_depends_on_batch(engine)

    async def run() -> dict:
        nonlocal peak
        generated, pending, outstanding, exhausted = {}, {}, 0, False
        try:
            while True:
                while not exhausted and (not pending or (not one_at_a_time and outstanding < budget_tokens)):
                    claimed = board.claim()
                    if claimed is None:
                        exhausted = True
                        break
                    chunk, prompts = claimed
                    seed = None if seed_of_home is None else seed_of_home(chunk.home)
                    task = asyncio.ensure_future(
                        sglang_engine.generate_async(
                            engine, prompts, seed=seed, first_prompt_index=chunk.first_prompt, **sampling
                        )
                    )
                    pending[task] = chunk
                    outstanding += chunk.est_tokens
                    peak = max(peak, len(pending))
                if not pending:
                    return generated
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    chunk = pending.pop(task)
                    outstanding -= chunk.est_tokens
                    generated[chunk] = task.result()
                    if on_chunk is not None:
                        on_chunk(chunk, generated[chunk])
        finally:
            for task in pending:
                task.cancel()

    generated = engine_health.call(engine, "generate", engine.loop.run_until_complete, run())
    return ChunkRun(
        generated, sum(len(s.response_ids) for samples in generated.values() for s in samples), peak
    )
