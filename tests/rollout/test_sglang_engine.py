"""The SGLang rollout engine wrapper against the real engine on a tiny Qwen2 (CPU here, GPU alike).

One engine serves the whole module (each start costs 10-25 s); tests that need another engine (same seed,
TP=2, inside torchrun, a failing start) start it beside this one, which also checks that stopping one
engine leaves the other running.
"""

import json
import math
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from distflow.plan.model_size import ModelArch
from distflow.plan.simulate import engine_probe
from distflow.testing.launch import tagged_json, torchrun
from distflow.workers.rollout import (
    EngineDiedError,
    EngineStartError,
    StaleEngineError,
    engine_health,
    generate,
    partial_generation,
    release_memory,
    resume_memory,
    shutdown_engine,
    start_engine,
    state_of,
    update_weights_from_disk,
    update_weights_from_tensors,
)

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "engine_in_torchrun.py"
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]
# seed sets SGLang's per-sample sampling_seed, which only deterministic-inference engines (GPU) honour.
SAMPLING = dict(n=4, temperature=1.0, max_new_tokens=12, seed=7)
GREEDY_TOKENS = 12


@pytest.fixture(scope="module")
def started(tiny_qwen2):
    """The module's engine, the environment around its start, and the samples of its first call."""
    env_before = dict(os.environ)
    engine = start_engine(tiny_qwen2, seed=0)
    env_after = dict(os.environ)
    first_samples = generate(engine, PROMPTS, **SAMPLING)
    yield dict(engine=engine, env_before=env_before, env_after=env_after, first_samples=first_samples)
    shutdown_engine(engine)


def greedy(engine, prompts=PROMPTS):
    """Greedy samples from an empty prefix cache, so that every call computes the prompts the same way."""
    engine.flush_cache()
    return generate(engine, prompts, temperature=0.0, max_new_tokens=GREEDY_TOKENS)


def test_start_leaves_the_environment_as_it_was(started):
    assert started["env_after"] == started["env_before"]


def test_samples_carry_rollout_logprobs(started):
    samples = started["first_samples"]
    assert [s.prompt_index for s in samples] == [0, 0, 0, 0, 1, 1, 1, 1]
    for s in samples:
        assert 1 <= len(s.response_ids) == len(s.logprobs) <= SAMPLING["max_new_tokens"]
        assert s.finish_reason in ("stop", "length")
        assert s.finish_reason == "stop" or len(s.response_ids) == SAMPLING["max_new_tokens"]
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in s.logprobs)
    assert len({tuple(s.response_ids) for s in samples[:4]}) > 1, "the n samples of a prompt should differ"


def test_seeded_samples_follow_the_policy(started, tiny_qwen2):
    """Seeded sampling (the CPU stand-in re-seeds before every token) draws each token from the policy: the
    count of tokens that repeat the previous one matches its probability under the HF model, and the sampled
    tokens' mean -log p matches the policy's mean entropy on the same positions (at temperature 1 the two are
    equal in expectation). With a seed that reused token 0's random numbers for token 1, a near-uniform tiny
    model repeated its first token in most samples."""
    from transformers import AutoModelForCausalLM

    prompts = [[5 + i, 6 + i, 7 + i, 8 + i] for i in range(8)]
    samples = generate(started["engine"], prompts, n=32, temperature=1.0, max_new_tokens=6, seed=11)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    repeats, expected_repeats, gaps = 0, 0.0, []
    with torch.no_grad():
        for s in samples:
            prompt = prompts[s.prompt_index]
            logp = torch.log_softmax(model(torch.tensor([prompt + s.response_ids])).logits[0].double(), -1)
            for t, token in enumerate(s.response_ids):
                row = logp[len(prompt) - 1 + t]
                gaps.append(-row[token].item() + (row.exp() * row).sum().item())
                if t:
                    repeats += token == s.response_ids[t - 1]
                    expected_repeats += row[s.response_ids[t - 1]].exp().item()
    assert repeats <= expected_repeats + 5 * math.sqrt(expected_repeats) + 3, (repeats, expected_repeats)
    gaps = torch.tensor(gaps)
    assert abs(gaps.mean()) < 5 * gaps.std() / math.sqrt(len(gaps)), (gaps.mean(), gaps.std(), len(gaps))


def test_stop_token_ends_the_response(started):
    (reference,) = greedy(started["engine"], PROMPTS[:1])
    stop = reference.response_ids[2]
    cut = reference.response_ids.index(stop)
    (stopped,) = generate(
        started["engine"], PROMPTS[:1], temperature=0.0, max_new_tokens=GREEDY_TOKENS, stop_token_ids=[stop]
    )
    assert stopped.finish_reason == "stop"
    assert stopped.response_ids == reference.response_ids[: cut + 1]


def test_stop_string_ends_the_response_and_keeps_its_tokens(started, tiny_qwen2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2)
    (reference,) = greedy(started["engine"], PROMPTS[:1])
    ids = reference.response_ids
    # The first token whose text does not occur in the text before it: generation must stop right there.
    cut, text = next(
        (i, t)
        for i in range(1, len(ids))
        if (t := tokenizer.decode([ids[i]]).strip()) and t not in tokenizer.decode(ids[:i])
    )
    (stopped,) = generate(
        started["engine"], PROMPTS[:1], temperature=0.0, max_new_tokens=GREEDY_TOKENS, stop=[text]
    )
    assert stopped.finish_reason == "stop", (text, ids, stopped.response_ids)
    assert stopped.response_ids == ids[: cut + 1], (text, ids)
    assert stopped.logprobs == pytest.approx(reference.logprobs[: cut + 1], abs=1e-5)


def test_weight_updates_change_and_restore_the_output(started, tiny_qwen2):
    engine = started["engine"]
    before = greedy(engine)
    original = load_file(tiny_qwen2 / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    perturbed = [(name, w + 0.5 * torch.randn(w.shape, generator=generator)) for name, w in original.items()]

    update_weights_from_tensors(engine, perturbed)
    changed = greedy(engine)
    assert [s.response_ids for s in changed] != [s.response_ids for s in before]

    update_weights_from_disk(engine, tiny_qwen2)
    assert greedy(engine) == before  # token ids and log-probs, exactly


def test_prompts_the_engine_has_not_seen_cost_the_prefill_the_calibration_measures(started, tiny_qwen2):
    # the simulator's CPU prefill rate: new prompts against the same ones again, held by the radix cache
    vocab = ModelArch.from_json(tiny_qwen2).vocab_size
    assert engine_probe.measure_prefill(started["engine"], vocab, length=60) > 0.0


def test_release_and_resume_memory(started):
    release_memory(started["engine"])
    resume_memory(started["engine"])
    assert greedy(started["engine"])


def test_weights_resume_alone_for_a_sync_then_the_rest(started, tiny_qwen2):
    """The colocated sync's order: release everything, resume the weights, load, then the KV cache and graphs."""
    engine = started["engine"]
    before = greedy(engine)
    release_memory(engine)
    resume_memory(engine, ["weights"])
    update_weights_from_tensors(engine, sorted(load_file(tiny_qwen2 / "model.safetensors").items()))
    resume_memory(engine, ["kv_cache", "cuda_graph"])
    assert greedy(engine) == before


def test_tp2_matches_tp1(started, tiny_qwen2):
    tp1 = greedy(started["engine"])
    engine = start_engine(tiny_qwen2, tp=2, seed=0)
    try:
        tp2 = greedy(engine)
    finally:
        shutdown_engine(engine)
    assert [s.response_ids for s in tp2] == [s.response_ids for s in tp1]
    diff = max(abs(a - b) for s1, s2 in zip(tp1, tp2) for a, b in zip(s1.logprobs, s2.logprobs))
    print(f"max |logprob tp2 - tp1| = {diff:.3g}")
    assert diff < 1e-4


def test_engine_starts_inside_a_torchrun_rank(started, tiny_qwen2):
    out = torchrun(JOB, nproc=2, args=[tiny_qwen2, json.dumps(PROMPTS[0]), GREEDY_TOKENS], timeout_s=600)
    assert sorted(re.findall(r"RANK-DONE (\d)", out)) == ["0", "1"], out  # the ranks' lines may be joined
    (result,) = tagged_json(out, "ENGINE-OK")
    (reference,) = greedy(started["engine"], PROMPTS[:1])
    assert result["tokens"] == reference.response_ids
    assert result["logprobs"] == pytest.approx(reference.logprobs, abs=1e-5)


def test_unknown_extra_arg_names_the_closest_field():
    with pytest.raises(ValueError, match=r"'disable_radix_cahce'.*did you mean 'disable_radix_cache'"):
        start_engine("/unused", extra_args={"disable_radix_cahce": True})
    with pytest.raises(ValueError, match="start_engine's argument 'tp'"):
        start_engine("/unused", extra_args={"tp_size": 2})


def test_missing_model_directory_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(EngineStartError, match=f"{missing}.*no such directory"):
        start_engine(missing)


def test_scheduler_death_raises_instead_of_killing_the_caller(started, tiny_qwen2, tmp_path):
    """SGLang's scheduler dies loading a corrupt checkpoint and SIGQUITs its parent, which survives."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen2, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    log = tmp_path / "logs" / "broken.log"
    with pytest.raises(EngineStartError, match=f"{broken}.*scheduler died") as raised:
        start_engine(broken, startup_timeout_s=600, log_path=log)
    # The error ends with the engine log's tail, which holds the scheduler's own error.
    message = str(raised.value)
    assert f"last lines of the engine log {log}" in message, message
    assert "SafetensorError" in message.split("last lines of the engine log")[1], message
    assert greedy(started["engine"])


def test_same_seed_gives_the_same_samples_and_a_dying_engine_is_an_error_not_a_hang(
    started, tiny_qwen2, tmp_path
):
    """A twin of the module's engine (same seed) gives the same samples. Then kill its scheduler while a long
    generate waits on it: EngineDiedError naming the dead process, with the log's tail; the caller survives,
    the engine is stale and later calls fail at once; the module's engine still serves.
    A partial rollout in flight on the twin (interrupted once by an update, so its requests hold tokens) dies
    with it and moves to the module's engine as to a restarted one: the next update there re-issues what
    each request had left, and every sample finishes from the tokens it had (the twin's version) with the
    new engine's (restart_engine's path)."""
    log = tmp_path / "engine.log"
    engine = start_engine(tiny_qwen2, seed=0, log_path=log)
    try:
        assert generate(engine, PROMPTS, **SAMPLING) == started["first_samples"]  # ids and log-probs, exactly
    except BaseException:
        shutdown_engine(engine)
        raise
    monitor = engine_health.monitor_of(engine)
    killed = threading.Event()

    def kill_scheduler_once_generating():
        while not monitor.in_call:
            time.sleep(0.01)
        time.sleep(0.3)
        for proc in monitor.processes:
            if "scheduler" in proc.name().lower() or "scheduler" in " ".join(proc.cmdline()).lower():
                proc.kill()
                killed.set()

    killer = threading.Thread(target=kill_scheduler_once_generating, daemon=True)
    module_engine = started["engine"]
    module_version = state_of(module_engine).version
    try:
        # versions that tell the twin's tokens from the module engine's
        update_weights_from_disk(engine, tiny_qwen2, version=module_version + 100)
        in_flight = partial_generation.submit(engine, PROMPTS, timeout_s=120, **LONG)
        time.sleep(0.3)
        update_weights_from_disk(engine, tiny_qwen2, version=module_version + 101)  # interrupts, continues
        kept = [list(r.tokens) for r in in_flight.requests]
        assert any(kept) and not all(r.finish_reason for r in in_flight.requests), kept
        killer.start()
        with pytest.raises(EngineDiedError, match="engine process .* died") as raised:
            generate(engine, PROMPTS * 8, temperature=1.0, max_new_tokens=2000)  # context: 2048
        killer.join(timeout=30)
        in_flight.move_to(module_engine)
        assert state_of(engine).in_flight == [] and state_of(module_engine).in_flight == [in_flight]
        update_weights_from_disk(module_engine, tiny_qwen2, version=module_version)
        samples = in_flight.result()
        assert state_of(module_engine).in_flight == []
        for s, tokens in zip(samples, kept):
            assert s.finish_reason in ("stop", "length") and len(s.response_ids) <= LONG["max_new_tokens"], s
            assert s.response_ids[: len(tokens)] == tokens
            assert s.token_versions[: len(tokens)] == [module_version + 100] * len(tokens), s.token_versions
            # after the kept tokens: the module engine's version (the twin's last wave died with it)
            assert set(s.token_versions[len(tokens) :]) <= {module_version}, s.token_versions
        assert any(len(s.response_ids) > len(t) for s, t in zip(samples, kept))  # re-issued, not dropped
        assert killed.is_set()
        assert f"last lines of the engine log {log}" in str(raised.value)
        assert "stale" in str(pytest.raises(StaleEngineError, state_of(engine).require_fresh).value)
        with pytest.raises(EngineDiedError):  # at once, without waiting on the dead process
            generate(engine, PROMPTS, max_new_tokens=4)
    finally:
        shutdown_engine(engine)
    assert greedy(started["engine"])  # stopping the twin left the module's engine running


def test_claimed_chunks_run_concurrently_and_match_one_call(started):
    """Unseeded chunks are all in flight at once under a large budget (SGLang's async API on the engine's
    loop); each sample keeps its prompt index in the whole list and equals the one-call greedy result."""
    from torch.distributed import HashStore

    from distflow.workers.rollout.chunked_generation import generate_claimed_chunks
    from distflow.workers.rollout.work_stealing import StoreBoard, split_into_chunks

    engine = started["engine"]
    prompts = PROMPTS + [[20, 21, 22, 23]]
    board = StoreBoard(HashStore(), 0, 0, 1, timeout_s=30)
    chunks = split_into_chunks(0, [len(p) for p in prompts], 1, GREEDY_TOKENS, chunk_prompts=1)
    board.publish(chunks, prompts)
    engine.flush_cache()
    run = generate_claimed_chunks(
        engine, board, None, budget_tokens=10**6, n=1, temperature=0.0, max_new_tokens=GREEDY_TOKENS
    )
    assert run.peak_in_flight == 3
    assert sorted((c.index, c.first_prompt) for c in run.generated) == [(0, 0), (1, 1), (2, 2)]
    samples = [s for c in chunks for s in run.generated[c]]
    assert [s.prompt_index for s in samples] == [0, 1, 2]
    assert run.tokens == sum(len(s.response_ids) for s in samples)
    assert [s.response_ids for s in samples] == [s.response_ids for s in greedy(engine, prompts)]


# --- partial rollouts: generation in flight across a weight update ------------------------------------------

LONG = dict(n=4, temperature=1.0, max_new_tokens=600, seed=5)  # long enough to be mid-way at the update


def _perturbed(tiny_qwen2, scale: float = 0.05):
    generator = torch.Generator().manual_seed(2)
    original = load_file(tiny_qwen2 / "model.safetensors")
    return {name: w + scale * torch.randn(w.shape, generator=generator) for name, w in original.items()}


def _policy_logprobs(tiny_qwen2, weights: dict, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(response[t] | prompt + response[:t]) under the HF model with `weights`, temperature 1."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    model.load_state_dict(weights, strict=False)  # tied embeddings: lm_head is embed_tokens
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def test_submitted_generation_without_an_update_equals_generate(started):
    """Nothing interrupts it: the same samples (same seeds, same batch) as one generate call."""
    engine = started["engine"]
    samples = partial_generation.submit(engine, PROMPTS, timeout_s=60, **SAMPLING).result()
    assert [s.response_ids for s in samples] == [s.response_ids for s in started["first_samples"]]
    for got, expected in zip(samples, started["first_samples"]):
        assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-6)
    assert all(set(s.token_versions) <= {s.weight_version} for s in samples)
    assert state_of(engine).in_flight == []


def test_streamed_generation_hands_over_each_group_and_samples_the_same(started):
    """on_group (reward.stream) gets each prompt's n samples once, as they finish, and on_sample
    (rollout.stream_chunks) each sample once, no later than its group; the requests are the same batch, so
    the samples equal one plain generate call's."""
    groups, singles, events = {}, {}, []

    def on_group(prompt, group):
        groups.setdefault(prompt, []).append(group)
        events.append(("group", prompt))

    def on_sample(prompt, j, sample):
        assert (prompt, j) not in singles
        singles[(prompt, j)] = sample
        events.append(("sample", prompt))

    samples = generate(started["engine"], PROMPTS, on_group=on_group, on_sample=on_sample, **SAMPLING)
    expected = started["first_samples"]
    assert [s.response_ids for s in samples] == [s.response_ids for s in expected]
    assert [s.logprobs for s in samples] == [s.logprobs for s in expected]
    assert sorted(groups) == [0, 1] and all(len(calls) == 1 for calls in groups.values())
    for prompt, (group,) in groups.items():
        assert [s.response_ids for s in group] == [
            s.response_ids for s in expected if s.prompt_index == prompt
        ]
    n = SAMPLING["n"]
    assert sorted(singles) == [(p, j) for p in (0, 1) for j in range(n)]
    for (prompt, j), sample in singles.items():
        assert sample.response_ids == expected[prompt * n + j].response_ids
        assert sample.logprobs == expected[prompt * n + j].logprobs
        # a group is handed over only after every one of its samples
        assert events.index(("group", prompt)) > max(
            i for i, e in enumerate(events) if e == ("sample", prompt)
        )


def test_a_weight_update_interrupts_and_continues_generation_in_flight(started, tiny_qwen2):
    """Submitted, then new weights while it generates: each interrupted sample keeps the tokens it had (the
    old version's), and every token after the update carries the new version with the log-prob the new
    weights give for that prefix (the HF model on the same weights, <= 1e-3 fp32)."""
    engine = started["engine"]
    old_version = state_of(engine).version
    original, new = load_file(tiny_qwen2 / "model.safetensors"), _perturbed(tiny_qwen2)
    in_flight = partial_generation.submit(engine, PROMPTS, timeout_s=120, **LONG)
    try:
        time.sleep(0.5)
        update_weights_from_tensors(engine, sorted(new.items()), version=old_version + 1)
        assert in_flight.interruptions == 1
        samples = in_flight.result()
    finally:
        update_weights_from_disk(engine, tiny_qwen2, version=old_version)
    spanning = [s for s in samples if len(set(s.token_versions)) == 2]
    assert spanning, [(len(s.response_ids), s.finish_reason) for s in samples]
    for s in samples:
        cut = s.token_versions.count(old_version)
        assert s.token_versions == [old_version] * cut + [old_version + 1] * (len(s.response_ids) - cut)
        assert len(s.logprobs) == len(s.response_ids) <= LONG["max_new_tokens"]
        assert s.weight_version == min(s.token_versions)
    for s in spanning[:2]:
        cut = s.token_versions.count(old_version)
        prompt = PROMPTS[s.prompt_index]
        before = _policy_logprobs(tiny_qwen2, original, prompt, s.response_ids[:cut])
        after = _policy_logprobs(tiny_qwen2, new, prompt, s.response_ids)[cut:]
        under_old = _policy_logprobs(tiny_qwen2, original, prompt, s.response_ids)[cut:]
        assert (after - under_old).abs().max() > 1e-2  # the two policies are told apart at this tolerance
        assert torch.tensor(s.logprobs[:cut]).double() == pytest.approx(before, abs=1e-3)
        assert torch.tensor(s.logprobs[cut:]).double() == pytest.approx(after, abs=1e-3)


def test_a_failed_update_leaves_generation_interrupted_and_the_caller_told(started, tiny_qwen2):
    """The update fails after it interrupted the requests: the generation is not continued on weights that
    are half loaded; result() raises StaleEngineError at once instead of waiting, and the next complete
    update serves again. A generation submitted meanwhile is sent once that update completes."""
    engine = started["engine"]
    version = state_of(engine).version

    def failing_tensors():
        yield from list(load_file(tiny_qwen2 / "model.safetensors").items())[:2]
        raise ConnectionError("trainer gone mid-transfer")

    in_flight = partial_generation.submit(engine, PROMPTS, timeout_s=120, **LONG)
    time.sleep(0.3)
    with pytest.raises(ConnectionError, match="mid-transfer"):
        update_weights_from_tensors(engine, failing_tensors(), version=version + 1)
    start = time.monotonic()
    with pytest.raises(StaleEngineError, match="did not complete"):
        in_flight.result()
    assert time.monotonic() - start < 5
    assert state_of(engine).in_flight == []
    # Submitted while stale (an engine restarted after a death): the requests wait for the next update.
    waiting = partial_generation.submit(engine, PROMPTS, timeout_s=120, **SAMPLING)
    assert state_of(engine).in_flight == [waiting] and waiting.requests[0].tokens == []
    update_weights_from_disk(engine, tiny_qwen2, version=version)
    samples = waiting.result()
    assert len(samples) == len(PROMPTS) * SAMPLING["n"], samples
    assert all(s.token_versions == [version] * len(s.response_ids) and s.response_ids for s in samples)
    assert greedy(engine)
