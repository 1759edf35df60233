"""Partial rollouts: generation that stays in flight across weight updates, each token tagged with the weight
version that sampled it.

A rank that owns an engine submits a rollout's requests (`submit`) and goes on with other work (the weight
sync); SGLang's scheduler processes generate meanwhile, and the engine's event loop collects their output
whenever the caller next runs it. When new weights arrive, every generation in flight on that engine is
interrupted first (engine_state.begin_update calls `interrupt`): each unfinished request is aborted and
SGLang returns what it sampled so far, with log-probs. (SGLang would otherwise hold the update until every
request finished: updates take its model-update lock.) Once the update completes
(engine_state.complete_update calls `resume`), each interrupted request continues from its prompt plus the
tokens it has, under the new weights: the prefix is prefilled again with them, as SGLang's
pause_generation(mode="retract") does, so every later token, and its log-prob, is exactly what the new
policy gives for that prefix. `result` waits for the rest.

An engine that dies with requests in flight (restarted within rollout.engine_restarts) takes them over
as if it had been interrupted when they were last collected: EngineRestarts.restart_engine moves them to the
new engine (`move_to`), and the sync that gives it weights continues them there.

What changes with an interruption, and what does not: a continued request samples with a seed derived from
its own and the tokens it has, so its samples still depend only on seeds, except for where the interruption
fell, which depends on timing (a run with partial rollouts is not bit-reproducible). A stop string that
spans the interruption is not seen (SGLang matches stop strings within one request's output); stop tokens
are. A continuation asks for the rest of max_new_tokens.

Who calls: RolloutWorker.submit / generate on engine owners (rollout.partial).
"""

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from distflow.workers.rollout import engine_health, sglang_engine
from distflow.workers.rollout.engine_state import state_of

_DISPATCH_POLL_S = 0.005


@dataclass
class _Request:
    prompt_index: int
    input_ids: list[int]
    params: dict
    """SGLang sampling params of the first submission (max_new_tokens, seed, stops, ...)."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    """None while the request still has tokens to sample."""


@dataclass
class _Wave:
    """One SGLang batch call: the first submission, or the continuation after an update."""

    task: asyncio.Task
    requests: list[_Request]
    rids: list[str]
    version: int


class InFlightGeneration:
    """A rollout's requests on one engine, which a weight update interrupts and continues (see the module
    doc). `result()` returns prompt-major RolloutSamples, as sglang_engine.generate."""

    def __init__(self, engine, requests: list[_Request], stop_token_ids, processor, timeout_s: float):
        self.engine, self.requests = engine, requests
        self.stop_token_ids = set(stop_token_ids or ())
        self.processor, self.timeout_s = processor, timeout_s
        self.interruptions = 0
        self._wave: _Wave | None = None
        if engine_health.is_dead(engine):
            raise engine_health.monitor_of(engine).error("submitting a rollout")
        # An engine restarted after a death serves no weights until its next sync: the requests wait for it
        # there (resume).
        if state_of(engine).fresh:
            self._send(requests)
        state_of(engine).in_flight.append(self)  # after the send: a refused one is not left registered

    # --- called by the engine's weight state around an update -------------------------------------------

    def interrupt(self) -> None:
        """Aborts the unfinished requests and keeps what they sampled (before a weight update)."""
        wave = self._wave
        if wave is None:
            return
        if not wave.task.done():
            for rid in wave.rids:
                self.engine.tokenizer_manager.abort_request(rid=rid)
            self.interruptions += 1
        self._collect()

    def resume(self) -> None:
        """Continues every unfinished request under the engine's current (new) weights."""
        if self._wave is None:
            self._send([r for r in self.requests if r.finish_reason is None])

    def move_to(self, engine) -> None:
        """The engine died and `engine` replaces it (restarted, its weights stale until the next sync): each
        request keeps what it sampled up to the last interruption, and its rest is re-issued on `engine`, as
        a continuation with its own seed, when that engine's next update completes (resume). What the dead
        engine sampled since the last interruption is lost with it."""
        self._wave = None
        self._forget()
        self.engine = engine
        state_of(engine).in_flight.append(self)

    # --- the caller ----------------------------------------------------------------------------------------

    def result(self) -> list[sglang_engine.RolloutSample]:
        """Waits for every request to finish; each sample's token_versions say which version sampled each
        token and weight_version is the oldest of them. EngineDiedError if the engine dies meanwhile;
        StaleEngineError if an update that interrupted it did not complete."""
        try:
            self._collect()
            if any(r.finish_reason is None for r in self.requests):
                state_of(self.engine).require_fresh()
                raise RuntimeError(
                    "partial generation: requests left unfinished without an update in progress"
                )
        finally:
            self._forget()
        return [
            sglang_engine.RolloutSample(
                prompt_index=r.prompt_index,
                response_ids=r.tokens,
                logprobs=r.logprobs,
                finish_reason=r.finish_reason,
                weight_version=min(r.versions, default=state_of(self.engine).version),
                token_versions=r.versions,
            )
            for r in self.requests
        ]

    def cancel(self) -> None:
        """Drops the generation: its requests are aborted and their samples discarded."""
        try:
            if self._wave is not None and not engine_health.is_dead(self.engine):
                self.interrupt()
        finally:
            self._forget()

    # --- internals -----------------------------------------------------------------------------------------

    def _send(self, requests: list[_Request]) -> None:
        if not requests:
            return
        state = state_of(self.engine)
        state.require_fresh()
        rids = [uuid.uuid4().hex for _ in requests]
        params = [self._continuation_params(r) for r in requests]
        kwargs = dict(
            input_ids=[r.input_ids + r.tokens for r in requests],
            sampling_params=params,
            return_logprob=True,
            rid=rids,
            custom_logit_processor=[self.processor] * len(requests) if self.processor else None,
        )
        task = self.engine.loop.create_task(self.engine.async_generate(**kwargs))
        self._wave = _Wave(task, requests, rids, state.version)
        self._run_until(lambda: task.done() or self._dispatched(rids), "generate (dispatch)")

    def _continuation_params(self, r: _Request) -> dict:
        if not r.tokens:
            return dict(r.params)
        p = dict(r.params, max_new_tokens=r.params["max_new_tokens"] - len(r.tokens))
        if "sampling_seed" in p:  # a seed of its own for the rest, a function of the first and the prefix
            p["sampling_seed"] = (p["sampling_seed"] * 1_000_003 + len(r.tokens)) % 2**63
            if "custom_params" in p:
                p["custom_params"] = {"sampling_seed": p["sampling_seed"]}
        return p

    def _dispatched(self, rids: list[str]) -> bool:
        states = self.engine.tokenizer_manager.rid_to_state
        return all(rid not in states or getattr(states[rid], "dispatched", True) for rid in rids)

    def _collect(self) -> None:
        """Waits for the current wave and appends what each of its requests sampled."""
        wave, self._wave = self._wave, None
        if wave is None:
            return
        self._run_until(wave.task.done, "generate")
        outputs = wave.task.result()
        for r, out in zip(wave.requests, outputs):
            ids, logprobs, reason = sglang_engine.response_of(
                out, r.prompt_index, ("stop", "length", "abort")
            )
            r.tokens += ids
            r.logprobs += logprobs
            r.versions += [wave.version] * len(ids)
            if reason != "abort":
                r.finish_reason = reason
            elif r.tokens and r.tokens[-1] in self.stop_token_ids:
                r.finish_reason = "stop"
            elif len(r.tokens) >= r.params["max_new_tokens"]:
                r.finish_reason = "length"

    def _run_until(self, done, what: str):
        """Runs the engine's event loop until done() (bounded by timeout_s; EngineDiedError on a death)."""

        async def wait():
            deadline = time.monotonic() + self.timeout_s
            while not done():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"SGLang engine: {what} did not finish within {self.timeout_s:.0f} s")
                await asyncio.sleep(_DISPATCH_POLL_S)

        return engine_health.call(self.engine, what, self.engine.loop.run_until_complete, wait())

    def _forget(self) -> None:
        in_flight = state_of(self.engine).in_flight
        if self in in_flight:
            in_flight.remove(self)


def submit(engine, prompt_ids: list[list[int]], timeout_s: float = 3600.0, **sampling) -> InFlightGeneration:
    """Sends the requests sglang_engine.generate(engine, prompt_ids, **sampling) would (same keyword
    arguments, same seeds) and returns once the engine has them; the engine generates while the caller goes
    on; to an engine whose weights are stale (restarted after a death), they are sent once its next update
    completes. timeout_s bounds every later wait on it."""
    _, requests, kwargs = sglang_engine.prepare_requests(engine, prompt_ids, fresh_only=False, **sampling)
    processors = kwargs["custom_logit_processor"]
    return InFlightGeneration(
        engine,
        [
            _Request(i, ids, params)
            for (i, _), ids, params in zip(requests, kwargs["input_ids"], kwargs["sampling_params"])
        ],
        sampling.get("stop_token_ids"),
        processors[0] if processors else None,
        timeout_s,
    )
