"""Generation time of one engine and of the slowest engine: prefill, then decode iterations under
continuous batching, with the straggler tail of long responses.

An engine holds `slots` sequences at once (the KV pool over the mean sequence length, capped by
max_running_requests); a finished sequence's slot takes the next waiting sample (SGLang's FCFS). A decode
iteration reads the engine GPU's weights once and every active sequence's KV cache once, or is bound by
its FLOPs, whichever is slower (a roofline), plus a fixed per-iteration cost and, with engine TP > 1, two
TP all-reduces per layer. So the last long responses cost whole iterations for a handful of sequences:
the tail. The step waits for the slowest engine, each engine drawing its own lengths.

With several engines the rollout worker does not hand its engine the whole partition: it claims chunks of
rollout.balance_chunk_prompts prompt groups (workers/rollout/chunked_generation.py) while the claimed
chunks' estimated tokens (prompt + n x max_new_tokens each) stay under rollout.balance_outstanding_tokens,
and one at a time where seeded samples depend on their batch mates (the CPU engines). A chunk's samples
enter the engine's queue when it is claimed, and its slot in the budget frees only when its last sample
ends: so an engine runs at most `chunks_in_flight` chunks' samples at once, and each chunk waits for its
longest response before the next is claimed (`Admission`).
"""

import heapq
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class EngineCost:
    """What one decode iteration and the prefill cost on one engine (per engine GPU, seconds)."""

    weights_read_s: float
    """Reading the engine GPU's weights once."""
    kv_read_s_per_token: float
    """Reading one cached token's K and V on one engine GPU."""
    flops_s_per_seq: float
    """One sequence's decode FLOPs on one engine GPU."""
    iteration_overhead_s: float
    """Fixed per iteration: scheduling, sampling, TP all-reduces."""
    prefill_s_per_token: float
    request_overhead_s: float = 0.0
    """Per sample, outside the iterations (tokenizing, scheduling, finishing); measured on CPU."""
    call_overhead_s: float = 0.0
    """Per generate call, outside its requests and iterations: the call's trip to the scheduler and its
    results' trip back, while the engine holds nothing else to run; measured on CPU."""

    def iteration_s(self, active: int, mean_context: float) -> float:
        memory = self.weights_read_s + active * mean_context * self.kv_read_s_per_token
        return max(memory, active * self.flops_s_per_seq) + self.iteration_overhead_s


def response_lengths(rng, count: int, max_new_tokens: int, fraction: float, sigma: float) -> np.ndarray:
    """Log-normal lengths with median fraction x max_new_tokens, clipped to [1, max_new_tokens], rounded to
    whole tokens (truncating would shorten them by half a token on average: a tenth of a 5-token answer)."""
    median = max(1.0, fraction * max_new_tokens)
    return np.rint(np.clip(rng.lognormal(math.log(median), sigma, count), 1, max_new_tokens)).astype(np.int64)


def quantile_lengths(count: int, max_new_tokens: int, fraction: float, sigma: float) -> np.ndarray:
    """The same distribution without sampling noise: its quantiles at (i + 0.5) / count, longest last.
    For the step's totals (tokens, data), so that they do not jitter between GPU counts."""
    median = max(1.0, fraction * max_new_tokens)
    q = (np.arange(count) + 0.5) / count
    normal = np.array([NormalDist().inv_cdf(x) for x in q])
    return np.rint(np.clip(median * np.exp(sigma * normal), 1, max_new_tokens)).astype(np.int64)


def iterations_held(lengths: np.ndarray, max_new_tokens: int) -> np.ndarray:
    """The iterations each response keeps its slot: its length, and one more where a stop token ended it
    before max_new_tokens. SGLang runs that iteration before the sample leaves the batch: on the CPU
    engine a chunk of 64 answers of at most 5 tokens (EOS included) ran 6 forwards, one of 6 ran 7, and an
    answer of 1 token stayed for 2 (8 tokens cut at max_new_tokens 8 ran 8); the GPU's overlap scheduler
    launches the next batch before the last one's finishes are known, the same one iteration. So each
    chunk's longest answer costs an iteration more than its tokens."""
    return lengths + (lengths < max_new_tokens)


@dataclass(frozen=True)
class Admission:
    """How samples reach an engine: all at once (chunk_samples None), or in chunks of `chunk_samples`
    consecutive samples with at most `chunks_in_flight` of them claimed and unfinished."""

    chunk_samples: int | None = None
    chunks_in_flight: int = 1


def chunks_in_flight(budget_tokens: int, chunk_est_tokens: float, one_at_a_time: bool) -> int:
    """Chunks an engine holds at once: it claims while the claimed chunks' estimated tokens are under the
    budget, and always at least one (chunked_generation.generate_claimed_chunks)."""
    if one_at_a_time or chunk_est_tokens <= 0:
        return 1
    return max(1, math.ceil(budget_tokens / chunk_est_tokens))


def continuous_batching(
    lengths: np.ndarray, slots: int, admission: Admission = Admission()
) -> tuple[np.ndarray, np.ndarray]:
    """FCFS over `slots`: start and end iteration of each sample. Under chunked admission a chunk's samples
    queue when it is claimed, at the iteration the earliest-finishing claimed chunk ended."""
    starts, ends = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    free = [0] * min(slots, len(lengths))
    heapq.heapify(free)
    size = admission.chunk_samples or max(1, len(lengths))
    claimed = [0] * admission.chunks_in_flight  # iterations at which the chunks in flight end
    heapq.heapify(claimed)
    for first in range(0, len(lengths), size):
        queued = heapq.heappop(claimed)  # the chunk is claimed when one in flight has ended
        chunk_end = queued
        for i in range(first, min(first + size, len(lengths))):
            t = max(heapq.heappop(free), queued)
            starts[i], ends[i] = t, t + int(lengths[i])
            heapq.heappush(free, t + int(lengths[i]))
            chunk_end = max(chunk_end, ends[i])
        heapq.heappush(claimed, chunk_end)
    return starts, ends


def decode_seconds(
    lengths: np.ndarray, slots: int, prompt_len: float, cost: EngineCost, admission: Admission = Admission()
) -> tuple[float, int]:
    """Seconds of the decode iterations and their number (the last sample's end)."""
    if not len(lengths):
        return 0.0, 0
    starts, ends = continuous_batching(lengths, slots, admission)
    times = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
    order = np.lexsort((delta, times))
    times, active = times[order], np.cumsum(delta[order])
    total = 0.0
    mean_context = prompt_len + float(lengths.mean()) / 2
    for t0, t1, a in zip(times[:-1], times[1:], active[:-1]):
        if t1 > t0 and a > 0:
            total += (t1 - t0) * cost.iteration_s(int(a), mean_context)
    return total, int(ends.max())


@dataclass(frozen=True)
class GenerationTime:
    prefill_s: float
    decode_s: float
    request_s: float
    calls_s: float
    """The round trips of the calls the engine idles through (calls_idle(admission, ...) of them)."""
    iterations: int
    """Decode iterations of the slowest engine."""
    mean_iterations: float
    """Over engines: (slowest - mean) / slowest is the straggler share."""
    response_tokens: int
    """Generated tokens of every engine together."""

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s + self.request_s + self.calls_s


def calls_idle(admission: Admission, samples: int) -> int:
    """Generate calls whose round trip the engine waits through with nothing to run: the first, and with
    one chunk in flight every chunk's (the next is sent only once the last one's results are back); with
    several in flight a chunk's round trip passes while the others generate."""
    if not samples:
        return 0
    if admission.chunk_samples is None or admission.chunks_in_flight > 1:
        return 1
    return math.ceil(samples / admission.chunk_samples)


def generation_time(
    engines: int,
    samples_per_engine: int,
    slots: int,
    prompt_len: float,
    max_new_tokens: int,
    cost: EngineCost,
    fraction: float,
    sigma: float,
    seed: int = 0,
    admission: Admission = Admission(),
) -> GenerationTime:
    """The slowest of `engines` engines, each generating samples_per_engine responses."""
    rng = np.random.default_rng(seed)
    worst, iters, tokens = (0.0, 0.0, 0), [], 0
    # Engines are statistically alike: beyond a few hundred, more draws only sharpen the maximum.
    for _ in range(engines):
        lengths = response_lengths(rng, samples_per_engine, max_new_tokens, fraction, sigma)
        decode, n_iter = decode_seconds(
            iterations_held(lengths, max_new_tokens), slots, prompt_len, cost, admission
        )
        iters.append(n_iter)
        tokens += int(lengths.sum())
        if decode >= worst[0]:
            worst = (decode, n_iter, int(lengths.sum()))
    prefill = samples_per_engine * prompt_len * cost.prefill_s_per_token
    return GenerationTime(
        prefill_s=prefill,
        decode_s=worst[0],
        request_s=samples_per_engine * cost.request_overhead_s,
        calls_s=calls_idle(admission, samples_per_engine) * cost.call_overhead_s,
        iterations=worst[1],
        mean_iterations=float(np.mean(iters)) if iters else 0.0,
        response_tokens=tokens,
    )
