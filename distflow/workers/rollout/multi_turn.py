"""Multi-turn rollouts (rollout.env): each trajectory alternates a policy turn on the engine and an
environment step, until the environment says done, rollout.max_turns turns, or rollout.max_total_tokens.

Token in, token out: a trajectory is kept as the token ids the engine saw and produced, never re-tokenized.
Each turn sends the prompt and everything so far as ids; the environment's answer enters as the tokens of
its chat-template turn (ObservationEncoder), with loss mask 0 and log-prob 0. The policy's tokens keep the
engine's log-probs and mask 1, so training, the data coordinator and the losses need nothing new: the mask
is the response mask.

Trajectories run concurrently (one coroutine each; SGLang batches their turns as they come), so a long one
holds back no other. Each turn samples with its own seed, a function of the trajectory's request seed and
its length so far, so a trajectory is a function of its seeds and its environment. On engines whose seeded
samples depend on their batch mates (the CPU stand-in, sglang_engine.sampling_depends_on_batch) turns are
sent one at a time to keep that true. The environment's step runs in a worker thread, bounded by
rollout.env_timeout_s; an exception or a timeout ends that trajectory with the reason in its `env` record.
"""

import asyncio
import contextlib
from dataclasses import dataclass

from distflow.envs import load_environment
from distflow.envs.base import Action
from distflow.envs.loading import load_tool_parser
from distflow.envs.observations import ObservationEncoder
from distflow.workers.rollout import engine_health, sglang_engine
from distflow.workers.rollout.sglang_engine import RolloutSample


@dataclass(frozen=True)
class TrajectoryPrompt:
    """A prompt as a trajectory starts from it: its ids and the row its environment resets with."""

    input_ids: list[int]
    sample: dict


@dataclass
class TrajectoryRunner:
    """How trajectories run on an engine owner: the environment class, the tool-call parser, the
    observation encoder and the limits (rollout.max_turns, max_total_tokens, env_timeout_s)."""

    env_class: type
    parser: object
    encoder: ObservationEncoder
    max_turns: int
    max_total_tokens: int
    env_timeout_s: float

    async def generate_async(
        self,
        engine,
        prompts: list[TrajectoryPrompt],
        n: int = 1,
        seed=None,
        first_prompt_index: int = 0,
        **sampling,
    ) -> list[RolloutSample]:
        """sglang_engine.generate_async's contract (n trajectories per prompt, prompt-major, the same request
        seeds), for TrajectoryPrompts."""
        version, requests, kwargs = sglang_engine.prepare_requests(
            engine,
            [p.input_ids for p in prompts],
            n,
            seed=seed,
            first_prompt_index=first_prompt_index,
            **sampling,
        )
        one_at_a_time = asyncio.Lock() if sglang_engine.sampling_depends_on_batch(engine) else None
        processors = kwargs.get("custom_logit_processor") or [None] * len(requests)
        runs = [
            self._trajectory(
                engine,
                prompts[i - first_prompt_index],
                i,
                dict(params),
                processor,
                version,
                one_at_a_time,
            )
            for (i, _), params, processor in zip(requests, kwargs["sampling_params"], processors)
        ]
        return list(await asyncio.gather(*runs))

    def generate(self, engine, prompts: list[TrajectoryPrompt], **kwargs) -> list[RolloutSample]:
        """generate_async, run to completion on the engine's event loop."""
        return engine_health.call(
            engine, "generate", engine.loop.run_until_complete, self.generate_async(engine, prompts, **kwargs)
        )

    async def _trajectory(self, engine, prompt, index, params, processor, version, one_at_a_time):
        record = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "status": "max_turns"}
        response, mask, logprobs, final_turn, finish = [], [], [], 0, "stop"
        per_turn = params["max_new_tokens"]
        env = await self._bounded(record, "reset", self._new_env, dict(prompt.sample, prompt_index=index))
        for turn in range(self.max_turns if env is not None else 0):
            budget = self.max_total_tokens - len(response)
            if budget <= 0:
                record["status"], finish = "length", "length"
                break
            call = dict(params, max_new_tokens=min(per_turn, budget))
            if turn and "sampling_seed" in call:  # its own seed per turn, a function of what came before
                call["sampling_seed"] = (params["sampling_seed"] * 1_000_003 + len(response)) % 2**63
                if "custom_params" in call:
                    call["custom_params"] = {"sampling_seed": call["sampling_seed"]}
            async with one_at_a_time or contextlib.nullcontext():
                out = await engine.async_generate(
                    input_ids=list(prompt.input_ids) + response,
                    sampling_params=call,
                    return_logprob=True,
                    custom_logit_processor=processor,
                )
            ids, lps, finish = sglang_engine.response_of(out, index)
            final_turn = len(response)
            response += ids
            mask += [1] * len(ids)
            logprobs += lps
            record["turns"] += 1
            if finish == "length" and len(response) >= self.max_total_tokens:
                record["status"] = "length"
                break
            text = self.encoder.tokenizer.decode(ids, skip_special_tokens=True)
            action = Action(text, tuple(self.parser.parse(text)))
            result = await self._bounded(record, "step", env.step, action)
            if result is None:
                break
            record["tool_calls"] += int(result.info.get("tool_calls", len(action.tool_calls)))
            record["tool_errors"] += int(result.info.get("tool_errors", 0))
            if result.reward is not None:  # per-step rewards add up (reward.env_reward_coef uses them)
                record["env_reward"] = record.get("env_reward", 0.0) + float(result.reward)
            if result.done:
                record["status"] = "done"
                break
            if turn == self.max_turns - 1:
                break
            observed = self.encoder.ids(
                str(result.observation), turn_ended=bool(ids) and ids[-1] == self.encoder.eos_id
            )
            if len(response) + len(observed) >= self.max_total_tokens:
                record["status"], finish = "length", "length"
                break
            response += observed
            mask += [0] * len(observed)
            logprobs += [0.0] * len(observed)
        return RolloutSample(
            prompt_index=index,
            response_ids=response,
            logprobs=logprobs,
            finish_reason=finish,
            weight_version=version,
            loss_mask=mask,
            final_turn=final_turn,
            env=record,
        )

    def _new_env(self, sample):
        env = self.env_class()
        env.reset(sample)
        return env

    async def _bounded(self, record: dict, what: str, fn, *args):
        """fn(*args) in a worker thread within rollout.env_timeout_s; None, with the reason in `record`,
        when it raised or ran over (the environment's failure ends its trajectory, not the run)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), self.env_timeout_s)
        except asyncio.TimeoutError:
            record.update(status="env_timeout", error=f"{what} took over {self.env_timeout_s:g} s")
        except Exception as err:
            record.update(status="env_error", error=f"{what}: {type(err).__name__}: {err}")
        return None


def runner_for(cfg, tokenizer) -> TrajectoryRunner | None:
    """The run's TrajectoryRunner (rollout.env), or None for one response per prompt."""
    r = cfg.rollout
    if r.env is None:
        return None
    return TrajectoryRunner(
        load_environment(r.env),
        load_tool_parser(r.tool_parser),
        ObservationEncoder(tokenizer),
        r.max_turns,
        r.max_total_tokens or r.max_new_tokens * r.max_turns,
        r.env_timeout_s,
    )
