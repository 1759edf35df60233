"""Starts and drives one SGLang engine (`sglang.Engine`) for rollouts; the same code runs on CPU and GPU.

A thin layer over SGLang's offline Engine API that adds what a training process sharing the engine needs:
- start-up that cannot take the caller down: SGLang answers a dead child process with SIGQUIT to its
  parent, whose default handler kills the whole process tree (the caller included; rc 137 under a test
  runner). We install our own handler, so a failed start raises `EngineStartError` naming the model and
  the cause, with the tail of the engine's log, within `startup_timeout_s` (engine_process);
- a log file per engine (`log_path`): the engine's processes write their stdout/stderr there, and every
  error about the engine ends with the log's last lines;
- calls that cannot hang on a dead engine: engine_health polls the engine's processes, and a call waiting
  on a dead one raises EngineDiedError (with the log's tail) within a second; so do later calls;
- an environment that is the caller's again once the engine is up (the CPU overlay from
  `distflow.cpu_support`, and the NCCL/CUDA variables SGLang sets while it starts; engine_process);
- weight updates that fail loudly instead of returning `(False, message)`;
- a shutdown that stops only this engine's processes (`Engine.shutdown` kills every child process of the
  caller, other engines included).

Who calls: the rollout worker on the rank that owns an engine (rank 0 of a rollout TP group), and tests.
"""

import asyncio
import atexit
import base64
import collections
import contextlib
import dataclasses
import difflib
import logging
import os
import time
from pathlib import Path

import numpy as np
import psutil

from distflow.cpu_support import cuda_available, sglang_cpu_launch
from distflow.workers.rollout import engine_health, engine_process
from distflow.workers.rollout.engine_health import with_log_tail
from distflow.workers.rollout.engine_state import state_of

logger = logging.getLogger(__name__)

# ServerArgs fields that start_engine sets from its own arguments.
_OWN_ARGS = {
    "model_path": "model_path",
    "tp_size": "tp",
    "dtype": "dtype",
    "random_seed": "seed",
    "device": "device",
    "mem_fraction_static": "mem_fraction_static",
    "max_total_tokens": "max_total_tokens",
}
# On CPU the KV-cache pool is sized from host memory; max_total_tokens keeps it small unless the caller asks
# for more. SGLang checks that (free memory after loading the weights) exceeds (1 - mem_fraction_static) x
# (free memory before): other processes allocating meanwhile (parallel tests, other engines) fail a tight
# fraction, so leave headroom; the cap on tokens, not the fraction, bounds what the pool takes.
_CPU_DEFAULTS = {
    "mem_fraction_static": 0.3,
    "max_total_tokens": 16384,
    "disable_cuda_graph": True,
    "enable_custom_logit_processor": True,  # for seeded sampling (seeded_sampling.py)
    # An idle scheduler otherwise polls its sockets in a loop, a core each, which on a CPU host the training
    # ranks beside it need: the README main job's step took 1.05-1.50 s with it polling and 0.54 s with
    # it waiting on its sockets (which wake it at once), with the same metrics (docs/scaling.md).
    "sleep_on_idle": True,
}


class EngineStartError(RuntimeError):
    """The engine did not become ready: bad model path or arguments, a child process died, or a timeout."""


class EngineCallError(RuntimeError):
    """An engine call reported failure (SGLang returns `(False, message)` rather than raising)."""


@dataclasses.dataclass
class RolloutSample:
    """One sampled response. `logprobs[i]` is the rollout log-prob of `response_ids[i]`."""

    prompt_index: int
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS or a stop token, included in response_ids) or "length"
    weight_version: int = 0
    """The engine's weight version (engine_state) that produced the sample (its oldest token's)."""
    token_versions: list[int] | None = None
    """The version that sampled each token, where a weight update fell inside the sample's generation
    (partial_generation); None: all weight_version."""
    routed_experts: np.ndarray | None = None
    """MoE engines started with enable_return_routed_experts: the experts the engine routed each token of
    prompt + response to, int32 [tokens - 1, layers * top_k] (the last token was never fed back); else None."""
    loss_mask: list[int] | None = None
    """Multi-turn trajectories (rollout.env): 1 on each response token the policy generated, 0 on the
    environment's (tool outputs, turn markers); None: every response token is the policy's."""
    final_turn: int = 0
    """Where the policy's last turn starts in response_ids (what an outcome scorer reads; 0: all of it)."""
    env: dict | None = None
    """Multi-turn: turns, tool_calls, tool_errors, status (done, max_turns, length, env_error, env_timeout)
    and, for an error, its message."""


def start_engine(
    model_path,
    tp: int = 1,
    dtype: str = "float32",
    seed: int = 0,
    device: str | None = None,
    mem_fraction_static: float | None = None,
    max_total_tokens: int | None = None,
    extra_args: dict | None = None,
    startup_timeout_s: float = 300,
    log_path=None,
    call_timeout_s: float | None = None,
):
    """Starts an `sglang.Engine` for `model_path` (a local Hugging Face directory or a hub id); returns it.

    device None means "cuda" when CUDA is available, else "cpu". `extra_args` are further SGLang
    ServerArgs fields (checked by name first). `seed` seeds the engine's sampler: two engines started with
    the same seed give the same samples for the same sequence of `generate` calls.
    log_path: the file the engine's processes write their output to (appended; its directory is created);
    None: a new file in the temporary directory. engine_health.log_path_of(engine) returns it.
    Raises EngineStartError, ending with the log's tail, if the engine is not ready within
    `startup_timeout_s`. call_timeout_s: the deadline of every later call on it (engine_health; None: none).
    """
    device = device or ("cuda" if cuda_available() else "cpu")
    model_path = str(model_path)
    args = dict(
        model_path=model_path,
        tp_size=tp,
        dtype=dtype,
        random_seed=seed,
        device=device,
        skip_server_warmup=True,
        custom_sigquit_handler=engine_process.on_engine_sigquit,
    )
    if device == "cpu":
        args.update(_CPU_DEFAULTS)
    for name, value in (("mem_fraction_static", mem_fraction_static), ("max_total_tokens", max_total_tokens)):
        if value is not None:
            args[name] = value

    launch = sglang_cpu_launch(tp) if device == "cpu" else engine_process.restored_environ()
    with launch, engine_process.restored_root_logger():
        args.update(_check_extra_args(extra_args or {}))
        follower = int(args.get("node_rank") or 0) >= 1
        if follower:  # a later node of a multi-node engine: its schedulers only; the constructor must return
            os.environ["SGLANG_BLOCK_NONZERO_RANK_CHILDREN"] = "0"
        _check_model_path(model_path)
        import sglang

        log_path = engine_process.new_log_file(log_path)
        tic = time.perf_counter()
        with engine_process.StartupGuard(model_path, startup_timeout_s) as guard:
            try:
                with engine_process.output_to(log_path):
                    engine = sglang.Engine(**args)
            except Exception as exc:
                guard.clean_up_failed_start(exc)
                raise EngineStartError(with_log_tail(guard.describe_failure(exc), log_path)) from exc
        if guard.timed_out:  # the deadline passed just as the start finished
            shutdown_engine(engine)
            raise EngineStartError(with_log_tail(guard.describe_failure(TimeoutError()), log_path))
    if not follower:  # followers run no tokenizer manager: rank 0 of the engine serves every request
        engine_process.take_sigquit(engine)
    engine_health.watch(engine, log_path, call_timeout_s=call_timeout_s)
    logger.info(
        "SGLang engine for %s (tp=%d, %s) ready in %.1f s; its log: %s",
        model_path,
        tp,
        device,
        time.perf_counter() - tic,
        log_path,
    )
    return engine


def _check_extra_args(extra_args: dict) -> dict:
    """Returns `extra_args` if every key is an SGLang ServerArgs field that start_engine does not set itself.

    Raises ValueError naming a bad key and the closest valid field name. Runs inside the launch
    environment: importing SGLang fixes its platform choice for the process.
    """
    if not extra_args:
        return {}
    valid = _server_arg_names()
    for key in extra_args:
        if key in _OWN_ARGS:
            raise ValueError(f"extra_args[{key!r}]: pass start_engine's argument {_OWN_ARGS[key]!r} instead")
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"extra_args[{key!r}] is not an SGLang ServerArgs field{hint}")
    return dict(extra_args)


def generate(
    engine,
    prompt_ids: list[list[int]],
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    max_new_tokens: int = 128,
    stop_token_ids: list[int] | None = None,
    stop: list[str] | None = None,
    seed: int | None = None,
    first_prompt_index: int = 0,
    on_group=None,
    on_sample=None,
) -> list[RolloutSample]:
    """Samples `n` responses per prompt; returns len(prompt_ids) * n samples, prompt-major.

    `stop`: stop strings; a sample that produces one ends there with finish reason "stop", and keeps the
    tokens that spelled it (they were sampled, so training sees them).
    Log-probs are SGLang's rollout log-probs: log-softmax of logits / temperature (top-p/top-k do not
    renormalise them); temperature 0 is greedy, with log-probs of the unscaled logits.
    `seed` gives every sample its own SGLang `sampling_seed`, which SGLang honours only on engines started
    with `enable_deterministic_inference` (GPU attention backends); engines started with
    `enable_custom_logit_processor` (the CPU default) get seeded_sampling's stand-in instead, so the samples
    depend on the seeds, not on the calls the engine served before; otherwise samples come from the
    engine's seeded sampler (see start_engine).
    `first_prompt_index`: prompt_ids are the prompts first_prompt_index, first_prompt_index + 1, ... of a
    larger list (a chunk of it); samples' prompt_index and sampling seeds count in that list, so a chunk
    samples with the seeds the whole list would give its prompts.
    The n samples of a prompt are sent as separate requests in one batch: SGLang's own `n` sends them one
    by one, which makes the batch composition, and so the sampled tokens, depend on timing.
    Every sample carries the engine's weight version. Raises StaleEngineError, before sending anything, on an
    engine whose last weight update did not complete (engine_state).
    `on_group(prompt_index, samples)`: called with a prompt's n samples as soon as the last of them finishes,
    while the others still generate (streaming: the caller scores them meanwhile); the same requests are
    sent either way, so the samples do not change. `on_sample(prompt_index, j, sample)`: called with each
    sample (the j-th of its prompt) as soon as it finishes.
    """
    version, requests, kwargs = prepare_requests(
        engine,
        prompt_ids,
        n,
        temperature,
        top_p,
        top_k,
        max_new_tokens,
        stop_token_ids,
        stop,
        seed,
        first_prompt_index,
    )
    if (on_group is not None or on_sample is not None) and streams_whole_outputs(engine):
        run = _streamed(engine, kwargs, requests, version, on_group, on_sample)
        outputs = engine_health.call(engine, "generate", engine.loop.run_until_complete, run)
    else:
        outputs = engine_health.call(engine, "generate", engine.generate, **kwargs)
    return [_to_sample(i, out, version) for (i, _), out in zip(requests, outputs)]


async def _streamed(engine, kwargs: dict, requests: list, version: int, on_group, on_sample) -> list[dict]:
    """The outputs of one batch call made with stream=True, calling on_sample for each sample as it finishes
    and on_group for each prompt whose samples have all finished (either may be None). Each request streams
    only its first token and its end (stream_interval past max_new_tokens): two messages per request, not
    one per token."""
    params = [dict(p, stream_interval=p["max_new_tokens"] + 1) for p in kwargs["sampling_params"]]
    outputs: list = [None] * len(requests)
    left = collections.Counter(prompt for prompt, _ in requests)
    first_of = {}  # the request index of each prompt's first sample (requests are prompt-major)
    for at, (prompt, _) in enumerate(requests):
        first_of.setdefault(prompt, at)
    members = collections.defaultdict(list)
    stream = await engine.async_generate(**dict(kwargs, sampling_params=params), stream=True)
    async for out in stream:
        if out["meta_info"].get("finish_reason") is None:
            continue
        at = out.get("index", 0)  # a batch of one carries no index
        outputs[at] = out
        prompt = requests[at][0]
        members[prompt].append(at)
        left[prompt] -= 1
        if on_sample is not None:
            on_sample(prompt, at - first_of[prompt], _to_sample(prompt, out, version))
        if not left[prompt] and on_group is not None:
            on_group(prompt, [_to_sample(prompt, outputs[i], version) for i in sorted(members.pop(prompt))])
    return outputs


def streams_whole_outputs(engine) -> bool:
    """True where a streamed output holds the whole response so far (SGLang's default), so its last message
    is the whole output; incremental_streaming_output engines send only what is new."""
    return not getattr(getattr(engine, "server_args", None), "incremental_streaming_output", False)


async def generate_async(
    engine,
    prompt_ids: list[list[int]],
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    max_new_tokens: int = 128,
    stop_token_ids: list[int] | None = None,
    stop: list[str] | None = None,
    seed: int | None = None,
    first_prompt_index: int = 0,
) -> list[RolloutSample]:
    """`generate` as a coroutine on the engine's event loop (SGLang's `async_generate`), so several calls can
    be in flight at once. The caller runs the loop through engine_health.call (which turns an engine death
    into EngineDiedError)."""
    version, requests, kwargs = prepare_requests(
        engine,
        prompt_ids,
        n,
        temperature,
        top_p,
        top_k,
        max_new_tokens,
        stop_token_ids,
        stop,
        seed,
        first_prompt_index,
    )
    outputs = await engine.async_generate(**kwargs)
    return [_to_sample(i, out, version) for (i, _), out in zip(requests, outputs)]


def sampling_depends_on_batch(engine) -> bool:
    """True where a seeded sample depends on the other requests in its batch (seeded_sampling's stand-in
    re-seeds once per batch): there, identical samples need identical batches."""
    from distflow.workers.rollout import seeded_sampling  # noqa: PLC0415 - imports SGLang: only once an engine runs

    return seeded_sampling.processor_for(engine) is not None


def prepare_requests(
    engine,
    prompt_ids,
    n=1,
    temperature=1.0,
    top_p=1.0,
    top_k=-1,
    max_new_tokens=128,
    stop_token_ids=None,
    stop=None,
    seed=None,
    first_prompt_index=0,
    fresh_only=True,
):
    """(weight version, [(prompt index, sample index)], keyword arguments of SGLang's generate) for a call
    (sglang_engine.generate's arguments). fresh_only=False: also for an engine whose weights are stale now
    (partial_generation sends such requests once an update completes)."""
    monitor = engine_health.monitor_of(engine)
    if monitor is not None and monitor.dead_reason is not None:
        raise monitor.error("generate")
    state = state_of(engine)
    if fresh_only:
        state.require_fresh()
    requests = [(first_prompt_index + i, j) for i in range(len(prompt_ids)) for j in range(n)]
    from distflow.workers.rollout import seeded_sampling  # noqa: PLC0415 - imports SGLang: only once an engine runs

    processor = seeded_sampling.processor_for(engine) if seed is not None else None
    params = []
    for i, j in requests:
        p = dict(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens)
        if stop_token_ids:
            p["stop_token_ids"] = list(stop_token_ids)
        if stop:  # SGLang matches them on the detokenized tail; the matching tokens stay in the response
            p["stop"] = list(stop)
        if seed is not None:
            p["sampling_seed"] = (seed * 1_000_003 + i * n + j) % 2**63
            if processor is not None:
                p["custom_params"] = {"sampling_seed": p["sampling_seed"]}
        params.append(p)
    kwargs = dict(
        input_ids=[list(prompt_ids[i - first_prompt_index]) for i, _ in requests],
        sampling_params=params,
        return_logprob=True,
        custom_logit_processor=[processor] * len(requests) if processor else None,
    )
    if returns_routed_experts(engine):
        kwargs["return_routed_experts"] = True
    return state.version, requests, kwargs


def returns_routed_experts(engine) -> bool:
    """Whether the engine was started to return the experts it routes each token to (MoE routing replay)."""
    return bool(getattr(getattr(engine, "server_args", None), "enable_return_routed_experts", False))


def update_weights_from_tensors(
    engine,
    named_tensors,
    load_format: str | None = None,
    flush_cache: bool = True,
    version: int | None = None,
) -> None:
    """Loads `(name, tensor)` pairs into the running engine, inside the begin/end session SGLang requires.

    With load_format None the names are Hugging Face checkpoint names, loaded through the model's
    `load_weights`; "direct" copies into SGLang's own (fused, TP-sharded) parameters.
    `version`: the weight version the engine serves once this update completes (None: unchanged); the engine
    is stale (generate refuses it) from the start of the update until it completes.
    """

    def call(what, *args, **kwargs):
        _check(engine_health.call(engine, what, getattr(engine, what), *args, **kwargs), what)

    with _updating(engine, version, "update_weights_from_tensor"):
        call("begin_weight_update")
        try:
            call(
                "update_weights_from_tensor",
                list(named_tensors),
                load_format=load_format,
                flush_cache=flush_cache,
            )
        finally:
            if not engine_health.is_dead(engine):
                call("end_weight_update")


def update_weights_from_disk(engine, path, version: int | None = None) -> None:
    """Reloads every weight from the checkpoint directory `path` (same architecture); `version` as above."""
    with _updating(engine, version, f"update_weights_from_disk({path})"):
        _check(
            engine_health.call(
                engine, "update_weights_from_disk", engine.update_weights_from_disk, str(path)
            ),
            f"update_weights_from_disk({path})",
        )


@contextlib.contextmanager
def _updating(engine, version: int | None, what: str):
    """Stale while the update runs; fresh (with `version`) only if it completes."""
    state = state_of(engine)
    state.begin_update(f"{what} did not complete")
    yield
    state.complete_update(version)


ENGINE_MEMORY = ("weights", "kv_cache", "cuda_graph")
"""What SGLang can release (its GPU_MEMORY_ALL_TYPES), named as its release/resume calls take them."""


def release_memory(engine, tags: list[str] | None = None) -> None:
    """Frees the engine's weights, KV cache and CUDA graphs (or only `tags` of ENGINE_MEMORY) while training
    runs (a no-op on CPU, same call path)."""
    engine.release_memory_occupation(tags=list(tags) if tags else None)


def resume_memory(engine, tags: list[str] | None = None) -> None:
    """Undoes `release_memory` for `tags` (default: all); push weights afterwards, released weights are not
    restored. Resuming "weights" alone before a weight sync keeps the KV cache out of the sync's peak."""
    engine.resume_memory_occupation(tags=list(tags) if tags else None)


def shutdown_engine(engine, timeout_s: float = 30) -> None:
    """Stops this engine's processes, and only those."""
    atexit.unregister(engine.shutdown)
    monitor = engine_health.monitor_of(engine)
    if monitor is not None:  # the kills below are no death to report
        monitor.stop()
    # The liveness watchdog would answer the kills below with SIGQUIT, which kills the caller.
    watchdog = getattr(engine.tokenizer_manager, "_subprocess_watchdog", None)
    if watchdog is not None:
        watchdog.stop()
    procs = []
    for pid in engine.get_all_child_pids():
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(pid)
            procs += [proc] + proc.children(recursive=True)
    engine_process.kill(procs, timeout_s)
    # The engine's event loop is the calling thread's, shared with later engines: end its tasks here, and
    # those its calls left when it died under them.
    tasks = list(getattr(engine.tokenizer_manager, "asyncio_tasks", ()))
    if monitor is not None:
        tasks += [task for task in monitor.orphaned_tasks if not task.done()]
        monitor.orphaned_tasks.clear()
    for task in tasks:
        task.cancel()
    if tasks:
        engine.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    engine_process.close_zmq_contexts(engine, engine.tokenizer_manager)


def _check_model_path(model_path: str) -> None:
    """Fails fast on a local path that does not exist (SGLang would report an invalid hub repo id)."""
    path = Path(model_path).expanduser()
    if model_path.startswith((os.sep, ".", "~")) and not path.is_dir():
        raise EngineStartError(f"SGLang engine for model {model_path!r} cannot start: no such directory")
    if path.is_dir() and not (path / "config.json").is_file():
        raise EngineStartError(f"SGLang engine for model {model_path!r} cannot start: no config.json there")


def _server_arg_names() -> list[str]:
    from sglang.srt.server_args import ServerArgs

    if dataclasses.is_dataclass(ServerArgs):
        names = [f.name for f in dataclasses.fields(ServerArgs)]
    else:  # 0.5.23 defines ServerArgs as a msgspec Struct
        import msgspec

        names = [f.name for f in msgspec.structs.fields(ServerArgs)]
    return [name for name in names if not name.startswith("_")]


# --- results -----------------------------------------------------------------------------------------------


def _to_sample(prompt_index: int, out: dict, weight_version: int) -> RolloutSample:
    ids, logprobs, reason = response_of(out, prompt_index)
    return RolloutSample(
        prompt_index=prompt_index,
        response_ids=ids,
        logprobs=logprobs,
        finish_reason=reason,
        weight_version=weight_version,
        routed_experts=routed_experts_of(out),
    )


def routed_experts_of(out: dict) -> np.ndarray | None:
    """The routes of one generate output, int32 [prompt + response tokens - 1, layers * top_k], or None when
    it carries none. SGLang sends them base64-encoded, token-major ([tokens, layers, top_k] int32)."""
    encoded = out["meta_info"].get("routed_experts")
    if encoded is None:
        return None
    meta = out["meta_info"]
    tokens = meta["prompt_tokens"] + len(out["output_ids"]) - 1
    flat = np.frombuffer(base64.b64decode(encoded), dtype=np.int32)
    if tokens <= 0 or flat.size % tokens:
        raise EngineCallError(
            f"generate: {flat.size} routed-expert entries do not split over the {tokens} tokens of request "
            f"{meta.get('id')} (prompt {meta['prompt_tokens']} + response {len(out['output_ids'])} - 1)"
        )
    return flat.reshape(tokens, -1)


def response_of(out: dict, prompt_index: int, ends=("stop", "length")) -> tuple[list[int], list[float], str]:
    """(token ids, their log-probs, finish reason) of one SGLang generate output; EngineCallError if it ended
    otherwise than `ends` or its log-probs do not line up with its tokens."""
    meta = out["meta_info"]
    reason = meta["finish_reason"] or {}
    if reason.get("type") not in ends:
        raise EngineCallError(f"generate: request for prompt {prompt_index} ended with {reason}")
    token_logprobs = meta["output_token_logprobs"]
    ids = list(out["output_ids"])
    if [t for _, t, _ in token_logprobs] != ids:
        raise EngineCallError(f"generate: log-probs do not line up with the output tokens ({meta['id']})")
    return ids, [float(lp) for lp, _, _ in token_logprobs], reason["type"]


def _check(result, what: str) -> None:
    """SGLang reports weight-update failures as (False, message[, ...]); turn them into exceptions."""
    ok, message = (result[0], result[1]) if isinstance(result, tuple) else (result, "")
    if not ok:
        raise EngineCallError(f"{what} failed: {message}")
