"""Generates claimed chunks on one engine, several in flight, until its board has nothing left to claim.

Who calls: RolloutWorker.generate on engine owners (rollout with more than one engine). The board
(work_stealing.LocalBoard or StoreBoard) decides which chunk comes next; this module keeps the engine busy:
it claims while the estimated tokens of claimed-but-unfinished chunks are under the budget (always at least
one chunk), so balancing is by outstanding tokens and SGLang's continuous batching still sees many requests.
Where seeded samples depend on their batch mates (sglang_engine.sampling_depends_on_batch: the CPU stand-in),
one chunk is in flight at a time, so a chunk's samples are the same whichever engine generates it.
"""
import asyncio

from distflow.workers.rollout import engine_health, sglang_engine


def generate_claimed_chunks(engine, board, seed_of_home, budget_tokens: int, **sampling) -> tuple[dict, int]:
    """Runs chunks from `board.claim()` on `engine` until it returns None.

    seed_of_home(home engine) -> the call seed of that home's partition (None: unseeded), so a sample's seed
    does not depend on the engine that generates it. `sampling`: sglang_engine.generate's n, temperature,
    top_p, top_k, max_new_tokens, stop_token_ids. Returns ({chunk: its samples, prompt-major, prompt_index
    counted in the home's partition}, response tokens generated here). Engine death: EngineDiedError.
    """
    one_at_a_time = sglang_engine.sampling_depends_on_batch(engine)

    async def run() -> dict:
        generated, pending, outstanding, exhausted = {}, {}, 0, False
        try:
            while True:
                while not exhausted and (not pending or (not one_at_a_time and outstanding < budget_tokens)):
                    claimed = board.claim()
                    if claimed is None:
                        exhausted = True
                        break
                    chunk, prompts = claimed
                    task = asyncio.ensure_future(sglang_engine.generate_async(
                        engine, prompts, seed=seed_of_home(chunk.home), first_prompt_index=chunk.first_prompt,
                        **sampling))
                    pending[task] = chunk
                    outstanding += chunk.est_tokens
                if not pending:
                    return generated
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    chunk = pending.pop(task)
                    outstanding -= chunk.est_tokens
                    generated[chunk] = task.result()
        finally:
            for task in pending:
                task.cancel()

    generated = engine_health.call(engine, "generate", engine.loop.run_until_complete, run())
    return generated, sum(len(s.response_ids) for samples in generated.values() for s in samples)
