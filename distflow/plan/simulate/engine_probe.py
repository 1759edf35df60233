"""The SGLang engine's figures for the calibrated profile (calibrate.py): a decode iteration's cost by batch,
a prompt token's prefill, a request's own cost, a call's own round trip, a weight update (fixed and per
tensor), a release and resume of its memory, the CPU cores it keeps busy idle and generating, and how much
slower engines generate at once."""

import os
import statistics
import time

import torch
import torch.multiprocessing as mp

from distflow.coordination.weights.staging import file_system_sharing
from distflow.models.conversion import HFCheckpoint
from distflow.plan.model_size import ModelArch
from distflow.plan.simulate.best_time import interleaved_median_seconds, median_seconds
from distflow.workers.rollout import shutdown_engine, start_engine, update_weights_from_tensors
from distflow.workers.rollout.sglang_engine import generate, release_memory, resume_memory

# engines generating at once whose slowdown is measured: a CPU job's ranks each run one (2 on this machine)
ENGINE_CROWD = (2,)


def _descendants_cpu_seconds() -> float:
    """User + system CPU seconds used so far by the live descendants of this process (from /proc)."""
    parent, ticks = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = open(f"/proc/{entry}/stat").read()
        except OSError:  # exited meanwhile
            continue
        rest = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid ... utime stime
        parent[int(entry)], ticks[int(entry)] = int(rest[1]), int(rest[11]) + int(rest[12])
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - mine
        mine |= frontier
    return sum(ticks[pid] for pid in mine) / os.sysconf("SC_CLK_TCK")


def measure_idle_engine_cores(engine, seconds: float = 2.0) -> float:
    """CPU cores an engine with nothing to do keeps busy while its memory is released (as a colocated
    engine is while the trainer trains): SGLang's scheduler polls its sockets in a loop unless started
    with sleep_on_idle, so on a CPU host it competes with the training ranks for the cores."""
    release_memory(engine)
    try:
        time.sleep(0.2)
        start_cpu, start = _descendants_cpu_seconds(), time.perf_counter()
        time.sleep(seconds)
        return (_descendants_cpu_seconds() - start_cpu) / (time.perf_counter() - start)
    finally:
        resume_memory(engine)


def measure_generating_engine_cores(engine, prompts: list, repeats: int = 3) -> float:
    """CPU cores an engine keeps busy while it generates: its scheduler and detokenizer (child processes)
    and its tokenizer manager (in this process, which otherwise waits for the reply), over the wall time of
    a batch's generation (the median of `repeats`). On a CPU host the engines of the ranks share the cores."""

    def cores() -> float:
        cpu, start = _descendants_cpu_seconds() + time.process_time(), time.perf_counter()
        generate(engine, prompts, max_new_tokens=33, stop_token_ids=[], temperature=1.0)
        return (_descendants_cpu_seconds() + time.process_time() - cpu) / (time.perf_counter() - start)

    return statistics.median(cores() for _ in range(repeats))


def _engine_crowd_worker(index: int, model_dir: str, batch: int, barrier, out, repeats: int):
    engine = start_engine(model_dir, tp=1, seed=index)
    try:
        prompts = [[1, 2, 3, 4, 5, 6, 7, 8]] * batch

        def call():
            generate(engine, prompts, max_new_tokens=9, stop_token_ids=[], temperature=1.0, seed=index)

        call()  # warm-up
        # Rounds of engine 0 alone (the others wait) and then every engine at once, in turn: the slowdown is
        # their ratio, and two blocks of runs gave 0.83-1.32 in five calibrations of one machine in an hour.
        alone, together = [], []
        for _ in range(repeats):
            barrier.wait()
            if index == 0:
                start = time.perf_counter()
                call()
                alone.append(time.perf_counter() - start)
            barrier.wait()  # every engine's call starts at once
            start = time.perf_counter()
            call()
            together.append(time.perf_counter() - start)
        out.put((index, statistics.median(alone) if alone else None, statistics.median(together)))
        barrier.wait()
    finally:
        shutdown_engine(engine)


def measure_engines_at_once(model_dir: str, counts=ENGINE_CROWD, batch: int = 64, repeats: int = 5) -> dict:
    """How much slower an engine generates while `n` engines generate at once on this host, each in its own
    process as the job's ranks run theirs: {str(n): (median time of a call with n at once) / (alone)}. On a
    CPU host they share the cores, their memory bandwidth and caches, which generating_cpu_cores alone
    does not tell (the main job's two engines: 1.14 measured against 1.04 from the cores they keep busy)."""
    ctx = mp.get_context("spawn")
    results = {}
    for n in counts:
        barrier, out = ctx.Barrier(n), ctx.Queue()
        procs = [
            ctx.Process(target=_engine_crowd_worker, args=(i, model_dir, batch, barrier, out, repeats))
            for i in range(n)
        ]
        for p in procs:
            p.start()
        rows = sorted(out.get(timeout=600) for _ in procs)
        for p in procs:
            p.join(120)
        results[str(n)] = statistics.mean(t for _, _, t in rows) / rows[0][1]
    return results


def measure_prefill(
    engine, vocab: int, prompts: int = 8, n: int = 8, length: int = 20, repeats: int = 5
) -> float:
    """Seconds per prompt token of a sample the engine spends on prompts it has not seen, as the rollout
    sends them: `prompts` distinct random prompts of `length` tokens sampled `n` times each
    (max_new_tokens 1), against the same call again, whose prompts the radix cache then holds. The decode
    calibration repeats one prompt, so it never pays this; the job's prompts are new every step. Per
    sample, not per prompt: on the CPU engine a prompt sampled 8 times costs 8 single prompts' prefill
    (14 ms against 12.5 for 64 distinct prompts, 20 tokens each)."""
    generator = torch.Generator().manual_seed(0)
    fresh, cached = [], []
    for _ in range(repeats + 1):  # the first pair warms up
        batch = torch.randint(10, vocab, (prompts, length), generator=generator).tolist()
        times = []
        for _ in range(2):
            start = time.perf_counter()
            generate(engine, batch, n=n, max_new_tokens=1, stop_token_ids=[], temperature=1.0, seed=1)
            times.append(time.perf_counter() - start)
        fresh.append(times[0])
        cached.append(times[1])
    extra = statistics.median(fresh[1:]) - statistics.median(cached[1:])
    return max(0.0, extra / (prompts * n * length))


def measure_engine(model_dir: str, batch: int = 64) -> dict:
    """One SGLang engine (TP 1) on the model: a decode iteration's cost at batch 1 and `batch` (from
    max_new_tokens 9 vs 1, EOS ignored, seeded requests), each request's own cost, a call's own round trip,
    a weight update of all and of half the tensors (a fixed cost and one per tensor), a release + resume of
    the engine's memory (what a colocated engine does every step with rollout.release_memory_in_training),
    and the CPU cores the released, idle engine keeps busy."""
    engine = start_engine(model_dir, tp=1)
    try:
        prompt = [[1, 2, 3, 4, 5, 6, 7, 8]]

        # Seeded, as every training rollout is (RolloutWorker.sampling_seed): on engines that sample
        # through seeded_sampling's stand-in (CPU) each iteration also runs its processor.
        def call(b, tokens):
            return lambda: generate(
                engine, prompt * b, max_new_tokens=tokens, stop_token_ids=[], temperature=1.0, seed=1
            )

        # the costs below are differences of these four: timed in turn (a median of 3 each, timed one
        # after the other, gave 0.13-0.30 ms a sequence in five calibrations of one machine in an hour)
        t = interleaved_median_seconds({(b, k): call(b, k) for b in (1, batch) for k in (1, 9)}, repeats=7)
        prefill = measure_prefill(engine, ModelArch.from_json(model_dir).vocab_size)
        generating_cores = measure_generating_engine_cores(engine, prompt * batch)
        per_iter = {b: (t[(b, 9)] - t[(b, 1)]) / 8 for b in (1, batch)}
        per_seq = max(0.0, (per_iter[batch] - per_iter[1]) / (batch - 1))
        request = max(0.0, (t[(batch, 1)] - t[(1, 1)]) / (batch - 1))
        # a call of one request and one token, less that iteration and request: the call's own round trip
        # (to the scheduler and back through the detokenizer), which a rank sending chunks one at a time
        # waits through between them (the main job's schedulers sleep 8-10 ms between chunks)
        call = max(0.0, t[(1, 1)] - per_iter[1] - request)
        tensors = staged_views(HFCheckpoint(model_dir))

        def update_with(named):
            with file_system_sharing():
                update_weights_from_tensors(engine, named)

        # a cost per tensor from all of them against half, timed in turn (timed in blocks of their own, a
        # slow spell on one side made the difference 0 in some calibrations)
        half = tensors[: len(tensors) // 2]
        u = interleaved_median_seconds(
            {"all": lambda: update_with(tensors), "half": lambda: update_with(half)}, repeats=9
        )
        update = u["all"]
        per_tensor = max(0.0, (update - u["half"]) / (len(tensors) - len(half)))

        def release_resume():
            release_memory(engine)
            resume_memory(engine)
            update_with(tensors)  # released weights come back empty

        cycle = median_seconds(release_resume, repeats=3) - update
        idle_cores = measure_idle_engine_cores(engine)
        update_with(tensors)
    finally:
        shutdown_engine(engine)
    return {
        "decode_iteration_s_base": per_iter[1] - per_seq,
        "decode_iteration_s_per_seq": per_seq,
        "prefill_s_per_token": prefill,
        "request_s": request,
        "call_s": call,
        "engine_update_s": update,
        "engine_update_s_per_tensor": per_tensor,
        "engine_update_fixed_s": max(0.0, update - per_tensor * len(tensors)),
        "engine_update_tensors": len(tensors),
        "release_resume_s": max(0.0, cycle),
        "engine_update_bytes": sum(v.numel() * v.element_size() for _, v in tensors),
        "idle_cpu_cores": idle_cores,
        "generating_cpu_cores": generating_cores,
    }


def staged_views(checkpoint: HFCheckpoint) -> list[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as views of one shared-memory buffer, as the weight resharder hands an
    engine its staging buffer: serializing a view then passes the buffer's name, where a tensor of its own
    is first copied into a new shared-memory segment (0.4-0.55 ms a tensor here against 0.02-0.05 ms)."""
    values = {n: checkpoint.get(n).contiguous() for n in checkpoint.names()}
    starts, at = {}, 0
    for name, value in values.items():
        starts[name] = at
        at += -(-value.numel() * value.element_size() // 8) * 8  # 8-byte aligned, for any dtype's view
    flat = torch.zeros(at, dtype=torch.uint8).share_memory_()
    out = []
    for name, value in values.items():
        nbytes = value.numel() * value.element_size()
        view = flat[starts[name] : starts[name] + nbytes].view(value.dtype).view(value.shape)
        view.copy_(value)
        out.append((name, view))
    return out
