"""Multi-turn trajectories (workers/rollout/multi_turn.py) on the real SGLang engine and a tiny Qwen2.

A scripted environment answers every turn, so a random policy still makes several turns. Each trajectory
is checked against one built by hand from its turns: the policy's tokens (mask 1, the engine's log-probs)
and the environment's, exactly the chat template's tool turn (mask 0, log-prob 0). That the engine saw
exactly those ids (token in, token out) is checked with transformers: its log-probs of every policy token,
given the whole trajectory before it, equal the engine's. An environment that raises or stalls ends only
its own trajectory, with the reason recorded.
"""

import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distflow.envs import Environment, StepResult
from distflow.envs.observations import ObservationEncoder
from distflow.envs.tool_parsers import HermesToolParser
from distflow.workers.rollout import shutdown_engine, start_engine
from distflow.workers.rollout.multi_turn import TrajectoryPrompt, TrajectoryRunner

pytestmark = pytest.mark.slow

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]
SAMPLING = dict(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=6, stop_token_ids=None, stop=None)


class Echo(Environment):
    """Answers turn t with "seen t: <the turn's text>" and a per-step reward of 0.5; never done by itself."""

    def reset(self, sample):
        self.turn = 0
        self.secret = sample["ground_truth"]

    def step(self, action):
        self.turn += 1
        return StepResult(f"seen {self.turn}: {action.text[:8]}", reward=0.5)


class FailsOnTurn2(Echo):
    def step(self, action):
        if self.turn == 1:
            raise KeyError("the tool's index is gone")
        return super().step(action)


class FailsToReset(Echo):
    def reset(self, sample):
        raise FileNotFoundError("corpus.idx")


class StallsOnTurn2(Echo):
    def step(self, action):
        if self.turn == 1:
            time.sleep(5)
        return super().step(action)


@pytest.fixture(scope="module")
def engine(tiny_qwen2):
    engine = start_engine(tiny_qwen2, seed=0)
    yield engine
    shutdown_engine(engine)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2):
    return AutoTokenizer.from_pretrained(tiny_qwen2)


def runner(tokenizer, env_class, max_turns=3, max_total_tokens=200, env_timeout_s=2.0):
    return TrajectoryRunner(
        env_class,
        HermesToolParser(),
        ObservationEncoder(tokenizer),
        max_turns,
        max_total_tokens,
        env_timeout_s,
    )


def prompts():
    return [
        TrajectoryPrompt(p, {"ground_truth": str(i), "data_source": "t", "extra_info": {}})
        for i, p in enumerate(PROMPTS)
    ]


def turns_of(sample) -> list[tuple[int, list[int]]]:
    """(mask value, ids) runs of a trajectory's response."""
    runs = []
    for token, mask in zip(sample.response_ids, sample.loss_mask):
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(token)
        else:
            runs.append((mask, [token]))
    return runs


def test_trajectories_interleave_policy_and_environment_tokens(engine, tokenizer, tiny_qwen2):
    samples = runner(tokenizer, Echo).generate(engine, prompts(), n=2, seed=11, **SAMPLING)
    assert [s.prompt_index for s in samples] == [0, 0, 1, 1]
    encoder = ObservationEncoder(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, torch_dtype=torch.float32)
    for s in samples:
        assert s.env["turns"] == 3 and s.env["status"] == "max_turns", s.env
        assert s.env["env_reward"] == 1.5, s.env  # the per-step rewards add up
        runs = turns_of(s)
        assert [m for m, _ in runs] == [1, 0, 1, 0, 1], (
            runs
        )  # policy, environment, policy, environment, policy
        # the hand-built trajectory: each environment run is exactly the template's tool turn for its text
        for turn, ((_, said), (_, answer)) in enumerate(zip(runs[0::2], runs[1::2]), start=1):
            text = tokenizer.decode(said, skip_special_tokens=True)
            ended = said[-1] == tokenizer.eos_token_id
            assert answer == encoder.ids(f"seen {turn}: {text[:8]}", turn_ended=ended)
        assert s.final_turn == len(s.response_ids) - len(runs[-1][1])
        assert len(s.logprobs) == len(s.response_ids)
        assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.loss_mask) if m == 0)
        # token in, token out: transformers' log-prob of each policy token, after all that came before it
        ids = torch.tensor([PROMPTS[s.prompt_index] + s.response_ids])
        with torch.no_grad():
            logits = model(ids).logits.float()
        reference = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        start = len(PROMPTS[s.prompt_index])
        for k, (lp, m) in enumerate(zip(s.logprobs, s.loss_mask)):
            if m:
                assert lp == pytest.approx(float(reference[start + k - 1]), abs=1e-3), (k, s.response_ids)


def test_seeded_trajectories_are_the_same_every_time(engine, tokenizer):
    """Seeded sampling on this engine depends on the batch (the CPU stand-in): its turns are sent one at a
    time, so two runs give the same trajectories, token for token."""
    run = runner(tokenizer, Echo)
    first, second = (run.generate(engine, prompts(), n=2, seed=11, **SAMPLING) for _ in range(2))
    assert [s.response_ids for s in first] == [s.response_ids for s in second]
    assert [s.logprobs for s in first] == [s.logprobs for s in second]
    assert len({tuple(s.response_ids) for s in first}) == 4  # the samples of a prompt differ


def test_the_token_budget_ends_a_trajectory(engine, tokenizer):
    samples = runner(tokenizer, Echo, max_turns=10, max_total_tokens=30).generate(
        engine, prompts(), n=1, seed=3, **SAMPLING
    )
    for s in samples:
        assert len(s.response_ids) <= 30 and s.env["status"] == "length" and s.finish_reason == "length", (
            s.env
        )
        assert s.env["turns"] < 10


@pytest.mark.parametrize(
    "env_class, status, reason",
    [
        (FailsOnTurn2, "env_error", 'KeyError: "the tool\'s index is gone"'),
        (StallsOnTurn2, "env_timeout", "step took over 1 s"),
    ],
)
def test_an_environment_failure_ends_only_its_trajectory(engine, tokenizer, env_class, status, reason):
    samples = runner(tokenizer, env_class, env_timeout_s=1.0).generate(
        engine, prompts(), n=1, seed=5, **SAMPLING
    )
    for s in samples:
        assert s.env["status"] == status and reason in s.env["error"], s.env
        assert s.env["turns"] == 2 and [m for m, _ in turns_of(s)] == [1, 0, 1], s.env  # ended after turn 2


def test_an_environment_that_cannot_reset_gives_an_empty_trajectory(engine, tokenizer):
    samples = runner(tokenizer, FailsToReset).generate(engine, prompts(), n=1, seed=5, **SAMPLING)
    for s in samples:
        assert s.env["status"] == "env_error" and "reset: FileNotFoundError: corpus.idx" in s.env["error"]
        assert s.response_ids == [] and s.env["turns"] == 0
