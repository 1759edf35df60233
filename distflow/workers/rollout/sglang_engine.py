"""Starts and drives one SGLang engine (`sglang.Engine`) for rollouts; the same code runs on CPU and GPU.

A thin layer over SGLang's offline Engine API that adds what a training process sharing the engine needs:
- start-up that cannot take the caller down: SGLang answers a dead child process with SIGQUIT to its
  parent, whose default handler kills the whole process tree (the caller included; rc 137 under a test
  runner). During start-up we install our own handler, so a failed start raises `EngineStartError`
  naming the model and the cause, within `startup_timeout_s`;
- an environment that is the caller's again once the engine is up (the CPU overlay from
  `distflow.cpu_support`, and the NCCL/CUDA variables SGLang sets while it starts);
- weight updates that fail loudly instead of returning `(False, message)`;
- a shutdown that stops only this engine's processes (`Engine.shutdown` kills every child process of the
  caller, other engines included).

Who calls: the rollout worker on the rank that owns an engine (rank 0 of a rollout TP group), and tests.
"""
import asyncio
import atexit
import contextlib
import dataclasses
import difflib
import logging
import os
import threading
import time
import types
from pathlib import Path

from distflow.cpu_support import apply_environ, cuda_available, sglang_cpu_launch

logger = logging.getLogger(__name__)

# ServerArgs fields that start_engine sets from its own arguments.
_OWN_ARGS = {"model_path": "model_path", "tp_size": "tp", "dtype": "dtype", "random_seed": "seed",
             "device": "device", "mem_fraction_static": "mem_fraction_static",
             "max_total_tokens": "max_total_tokens"}
# On CPU the KV-cache pool is sized from host memory; keep it small unless the caller asks for more.
_CPU_DEFAULTS = {"mem_fraction_static": 0.05, "max_total_tokens": 16384, "disable_cuda_graph": True,
                 "enable_custom_logit_processor": True}  # for seeded sampling (seeded_sampling.py)


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


def start_engine(model_path, tp: int = 1, dtype: str = "float32", seed: int = 0, device: str | None = None,
                 mem_fraction_static: float | None = None, max_total_tokens: int | None = None,
                 extra_args: dict | None = None, startup_timeout_s: float = 300):
    """Starts an `sglang.Engine` for `model_path` (a local Hugging Face directory or a hub id); returns it.

    device None means "cuda" when CUDA is available, else "cpu". `extra_args` are further SGLang
    ServerArgs fields (checked by name first). `seed` seeds the engine's sampler: two engines started with
    the same seed give the same samples for the same sequence of `generate` calls.
    Raises EngineStartError if the engine is not ready within `startup_timeout_s`.
    """
    device = device or ("cuda" if cuda_available() else "cpu")
    model_path = str(model_path)
    args = dict(model_path=model_path, tp_size=tp, dtype=dtype, random_seed=seed, device=device,
                skip_server_warmup=True, custom_sigquit_handler=_on_engine_sigquit)
    if device == "cpu":
        args.update(_CPU_DEFAULTS)
    for name, value in (("mem_fraction_static", mem_fraction_static), ("max_total_tokens", max_total_tokens)):
        if value is not None:
            args[name] = value

    launch = sglang_cpu_launch(tp) if device == "cpu" else _restored_environ()
    with launch, _restored_root_logger():
        args.update(_check_extra_args(extra_args or {}))
        _check_model_path(model_path)
        import sglang

        tic = time.perf_counter()
        with _StartupGuard(model_path, startup_timeout_s) as guard:
            try:
                engine = sglang.Engine(**args)
            except Exception as exc:
                guard.clean_up_failed_start(exc)
                raise EngineStartError(guard.describe_failure(exc)) from exc
        if guard.timed_out:  # the deadline passed just as the start finished
            shutdown_engine(engine)
            raise EngineStartError(guard.describe_failure(TimeoutError()))
    logger.info("SGLang engine for %s (tp=%d, %s) ready in %.1f s", model_path, tp, device,
                time.perf_counter() - tic)
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


def generate(engine, prompt_ids: list[list[int]], n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
             top_k: int = -1, max_new_tokens: int = 128, stop_token_ids: list[int] | None = None,
             seed: int | None = None) -> list[RolloutSample]:
    """Samples `n` responses per prompt; returns len(prompt_ids) * n samples, prompt-major.

    Log-probs are SGLang's rollout log-probs: log-softmax of logits / temperature (top-p/top-k do not
    renormalise them); temperature 0 is greedy, with log-probs of the unscaled logits.
    `seed` gives every sample its own SGLang `sampling_seed`, which SGLang honours only on engines started
    with `enable_deterministic_inference` (GPU attention backends); engines started with
    `enable_custom_logit_processor` (the CPU default) get seeded_sampling's stand-in instead, so the samples
    depend on the seeds, not on the calls the engine served before; otherwise samples come from the
    engine's seeded sampler (see start_engine).
    The n samples of a prompt are sent as separate requests in one batch: SGLang's own `n` sends them one
    by one, which makes the batch composition, and so the sampled tokens, depend on timing.
    """
    requests = [(i, j) for i in range(len(prompt_ids)) for j in range(n)]
    from distflow.workers.rollout import seeded_sampling  # imports SGLang: only once an engine runs

    processor = seeded_sampling.processor_for(engine) if seed is not None else None
    params = []
    for i, j in requests:
        p = dict(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens)
        if stop_token_ids:
            p["stop_token_ids"] = list(stop_token_ids)
        if seed is not None:
            p["sampling_seed"] = (seed * 1_000_003 + i * n + j) % 2**63
            if processor is not None:
                p["custom_params"] = {"sampling_seed": p["sampling_seed"]}
        params.append(p)
    outputs = engine.generate(input_ids=[list(prompt_ids[i]) for i, _ in requests], sampling_params=params,
                              return_logprob=True,
                              custom_logit_processor=[processor] * len(requests) if processor else None)
    return [_to_sample(i, out) for (i, _), out in zip(requests, outputs)]


def update_weights_from_tensors(engine, named_tensors, load_format: str | None = None,
                                flush_cache: bool = True) -> None:
    """Loads `(name, tensor)` pairs into the running engine, inside the begin/end session SGLang requires.

    With load_format None the names are Hugging Face checkpoint names, loaded through the model's
    `load_weights`; "direct" copies into SGLang's own (fused, TP-sharded) parameters.
    """
    _check(engine.begin_weight_update(), "begin_weight_update")
    try:
        _check(engine.update_weights_from_tensor(list(named_tensors), load_format=load_format,
                                                 flush_cache=flush_cache), "update_weights_from_tensor")
    finally:
        _check(engine.end_weight_update(), "end_weight_update")


def update_weights_from_disk(engine, path) -> None:
    """Reloads every weight from the checkpoint directory `path` (same architecture)."""
    _check(engine.update_weights_from_disk(str(path)), f"update_weights_from_disk({path})")


def release_memory(engine) -> None:
    """Frees the engine's weights and KV cache while training runs (a no-op on CPU, same call path)."""
    engine.release_memory_occupation()


def resume_memory(engine) -> None:
    """Undoes `release_memory`; push weights afterwards, the released weights are not restored."""
    engine.resume_memory_occupation()


def shutdown_engine(engine, timeout_s: float = 30) -> None:
    """Stops this engine's processes, and only those."""
    import psutil

    atexit.unregister(engine.shutdown)
    # The liveness watchdog would answer the kills below with SIGQUIT, which kills the caller.
    watchdog = getattr(engine.tokenizer_manager, "_subprocess_watchdog", None)
    if watchdog is not None:
        watchdog.stop()
    procs = []
    for pid in engine.get_all_child_pids():
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(pid)
            procs += [proc] + proc.children(recursive=True)
    _kill(procs, timeout_s)
    # The engine's event loop is the calling thread's, shared with later engines: end its tasks here.
    tasks = list(getattr(engine.tokenizer_manager, "asyncio_tasks", ()))
    for task in tasks:
        task.cancel()
    if tasks:
        engine.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    _close_zmq_contexts(engine, engine.tokenizer_manager)


def _zmq_contexts_in_traceback(tb) -> list:
    """The open ZeroMQ contexts that a traceback's frames hold in locals, directly or one attribute deep."""
    import zmq

    found = {}

    def consider(value):
        # type(), not isinstance: isinstance reads __class__, which lazy proxies may answer with side effects.
        if issubclass(type(value), zmq.Socket):
            value = value.context
        if issubclass(type(value), zmq.Context) and not value.closed:
            found[id(value)] = value

    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            consider(value)
            if not issubclass(type(value), (type, types.ModuleType)):
                try:  # the instance's own attributes, without running any __getattr__
                    attributes = object.__getattribute__(value, "__dict__")
                except (AttributeError, TypeError):
                    continue
                for attribute in list(attributes.values()):
                    consider(attribute)
        tb = tb.tb_next
    return list(found.values())


def _close_zmq_contexts(*owners) -> None:
    """Closes the ZeroMQ contexts behind the owners' sockets without waiting on unsent messages.

    Otherwise garbage collection of the stopped engine destroys them with the sockets' default linger,
    which blocks forever once the peers are gone (seen as a hang at pytest's exit).
    """
    import zmq

    contexts = {id(v.context): v.context for owner in owners if owner is not None
                for v in vars(owner).values() if isinstance(v, zmq.Socket)}
    for context in contexts.values():
        context.destroy(linger=0)


# --- start-up protection -------------------------------------------------------------------------------

_starts_in_progress = 0
_start_lock = threading.Lock()


def _on_engine_sigquit(signum, frame):
    """SIGQUIT handler for the engine's owner (SGLang's children send SIGQUIT when they fail).

    During a start the failure is reported by the start itself (SGLang notices the dead scheduler), so the
    signal is only logged. Afterwards a dead child leaves the engine unusable: like SGLang's own handler,
    end the process tree instead of letting the next call wait forever.
    """
    if _starts_in_progress:
        logger.error("an SGLang engine process failed during start-up (its traceback is above)")
        return
    from sglang.srt.utils import kill_process_tree

    logger.error("an SGLang engine process died; ending this process and its children")
    kill_process_tree(os.getpid())


class _StartupGuard:
    """Counts a start in progress and, past the deadline, kills the processes the start spawned.

    Killing them makes SGLang's wait for its schedulers fail within seconds, so a hung start (for example a
    scheduler blocked on a rendezvous) becomes an error. A hang in this process itself cannot be cut short.
    """

    def __init__(self, model_path: str, timeout_s: float):
        import psutil

        self.model_path, self.timeout_s = model_path, timeout_s
        self.timed_out = False
        self._me = psutil.Process()
        self._children_before = {p.pid for p in self._me.children(recursive=True)}
        self._done = threading.Event()

    def __enter__(self):
        global _starts_in_progress
        with _start_lock:
            _starts_in_progress += 1
        threading.Thread(target=self._watch, name="engine-startup-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc):
        global _starts_in_progress
        self._done.set()
        with _start_lock:
            _starts_in_progress -= 1

    def _watch(self):
        if not self._done.wait(self.timeout_s):
            self.timed_out = True
            logger.error("SGLang engine for %s not ready after %.0f s; killing its processes",
                         self.model_path, self.timeout_s)
            self.kill_new_children()

    def kill_new_children(self):
        """Kills the processes spawned since the start began, except multiprocessing's shared helpers."""
        new = [p for p in self._me.children(recursive=True) if p.pid not in self._children_before]
        _kill([p for p in new if not _is_multiprocessing_helper(p)], timeout_s=30)

    def clean_up_failed_start(self, exc: Exception):
        """Ends what a failed start leaves behind: its processes, and the ZeroMQ contexts its frames hold
        (the half-built tokenizer manager's), whose destruction at garbage collection would otherwise wait
        forever on the dead peers."""
        self.kill_new_children()
        for context in _zmq_contexts_in_traceback(exc.__traceback__):
            context.destroy(linger=0)

    def describe_failure(self, exc: Exception) -> str:
        what = (f"did not become ready within {self.timeout_s:.0f} s (startup_timeout_s)" if self.timed_out
                else f"failed: {type(exc).__name__}: {str(exc).rstrip('.')}")
        return (f"SGLang engine for model {self.model_path!r} {what}. A scheduler failure prints its "
                "traceback to stderr above this error.")


def _is_multiprocessing_helper(proc) -> bool:
    import psutil

    try:
        return any("resource_tracker" in part or "forkserver" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def _kill(procs, timeout_s: float) -> None:
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=timeout_s)


def _check_model_path(model_path: str) -> None:
    """Fails fast on a local path that does not exist (SGLang would report an invalid hub repo id)."""
    path = Path(model_path).expanduser()
    if model_path.startswith((os.sep, ".", "~")) and not path.is_dir():
        raise EngineStartError(f"SGLang engine for model {model_path!r} cannot start: no such directory")
    if path.is_dir() and not (path / "config.json").is_file():
        raise EngineStartError(f"SGLang engine for model {model_path!r} cannot start: no config.json there")


@contextlib.contextmanager
def _restored_environ():
    """SGLang sets NCCL_*, CUDA_DEVICE_MAX_CONNECTIONS, ... in os.environ while it starts; its processes
    have inherited them by the end, and Megatron in this process must not see them."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        apply_environ(saved)


@contextlib.contextmanager
def _restored_root_logger():
    """SGLang calls logging.basicConfig(force=True) in the calling process; give the caller its logging back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _server_arg_names() -> list[str]:
    from sglang.srt.server_args import ServerArgs

    if dataclasses.is_dataclass(ServerArgs):
        names = [f.name for f in dataclasses.fields(ServerArgs)]
    else:  # 0.5.23 defines ServerArgs as a msgspec Struct
        import msgspec

        names = [f.name for f in msgspec.structs.fields(ServerArgs)]
    return [name for name in names if not name.startswith("_")]


# --- results -----------------------------------------------------------------------------------------------

def _to_sample(prompt_index: int, out: dict) -> RolloutSample:
    meta = out["meta_info"]
    reason = meta["finish_reason"] or {}
    if reason.get("type") not in ("stop", "length"):
        raise EngineCallError(f"generate: request for prompt {prompt_index} ended with {reason}")
    token_logprobs = meta["output_token_logprobs"]
    ids = list(out["output_ids"])
    if [t for _, t, _ in token_logprobs] != ids:
        raise EngineCallError(f"generate: log-probs do not line up with the output tokens ({meta['id']})")
    return RolloutSample(prompt_index=prompt_index, response_ids=ids,
                         logprobs=[float(lp) for lp, _, _ in token_logprobs], finish_reason=reason["type"])


def _check(result, what: str) -> None:
    """SGLang reports weight-update failures as (False, message[, ...]); turn them into exceptions."""
    ok, message = (result[0], result[1]) if isinstance(result, tuple) else (result, "")
    if not ok:
        raise EngineCallError(f"{what} failed: {message}")
