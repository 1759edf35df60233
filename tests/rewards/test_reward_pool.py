"""RewardPool: selection, custom scorers by dotted path, and failures that score 0 without stopping the batch."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from distflow.rewards import EXPECTED_SIGNATURE, RewardPool, RewardSample, ScorerError, load_scorer

REPO = Path(__file__).resolve().parents[2]


def sample(response, truth="ok", data_source="mine", eos=True):
    return RewardSample(response, truth, data_source, eos)


@pytest.fixture(scope="module")
def misbehaving_pool():
    with RewardPool(custom="scorers_for_tests:misbehaving", num_workers=2, timeout_s=1.5) as pool:
        yield pool


def test_failures_score_zero_and_are_counted(misbehaving_pool):
    batch = [
        sample("ok"),
        sample("raise"),
        sample("sleep"),
        sample("nan"),
        sample("exit"),
        sample("ok"),
        sample("no"),
    ]
    start = time.monotonic()
    rewards, stats = misbehaving_pool.score_batch(batch)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert stats["reward/errors"] == 3 and stats["reward/timeouts"] == 1  # raise, nan, exit; sleep
    assert stats["reward/mean"] == pytest.approx(2 / 7)
    assert time.monotonic() - start < 30  # the sleeping scorer was killed, not waited for (60 s)
    messages = dict(misbehaving_pool.last_errors)
    assert "RuntimeError: scorer bug" in messages[1] and "timed out" in messages[2]
    assert "worker died" in messages[4]
    # The pool still works after its workers were killed and replaced, even one that died while idle.
    misbehaving_pool._workers[0].proc.kill()
    misbehaving_pool._workers[0].proc.wait()
    rewards, stats = misbehaving_pool.score_batch([sample("ok"), sample("no")] * 3)
    assert rewards == [1.0, 0.0] * 3 and stats["reward/errors"] == stats["reward/timeouts"] == 0


def test_inline_mode_counts_errors():
    pool = RewardPool(custom="scorers_for_tests:misbehaving", num_workers=0)
    rewards, stats = pool.score_batch([sample("ok"), sample("raise"), sample("nan")])
    assert rewards == [1.0, 0.0, 0.0] and stats["reward/errors"] == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_submitted_ahead_are_claimed_by_key(workers):
    """Streaming: samples submitted while others generate are scored once; score_batch with their keys takes
    those results; a new stream forgets what the last one left unclaimed, though its keys come again."""
    with RewardPool(custom="scorers_for_tests:misbehaving", num_workers=workers, timeout_s=5) as pool:
        pool.begin_stream()
        pool.submit([10, 11, 12], [sample("ok"), sample("no"), sample("raise")])
        deadline = time.monotonic() + 60
        while len(pool.finished_at) < 3 and time.monotonic() < deadline:
            pool.poll(wait_s=0.1)  # the generation loop's polls: the three finish before they are claimed
        rewards, stats = pool.score_batch(
            [sample("ok"), sample("no"), sample("raise"), sample("ok")], [10, 11, 12, 13]
        )
        assert rewards == [1.0, 0.0, 0.0, 1.0] and stats["reward/errors"] == 1
        first, last, count = pool.last_stream
        assert count == 3 and first <= last
        # Claimed results are not claimed twice; what a forgotten stream left is not taken for a new sample.
        pool.submit([20], [sample("ok")])
        pool.begin_stream()
        assert pool.score_batch([sample("no")], [20])[0] == [0.0] and pool.last_stream is None
        assert pool.score_batch([sample("ok")], [10])[0] == [1.0]


def test_auto_selects_by_data_source():
    pool = RewardPool("auto", num_workers=0)
    rewards, stats = pool.score_batch(
        [
            dict(response="#### 7", ground_truth="7", data_source="openai/gsm8k", ended_with_eos=True),
            dict(
                response="\\boxed{0.5}",
                ground_truth="\\frac12",
                data_source="HuggingFaceH4/MATH-500",
                ended_with_eos=True,
            ),
            dict(response="12", ground_truth="12", data_source="distflow/copy", ended_with_eos=False),
            dict(response="...\nAnswer: 34", ground_truth="34", data_source="math_dapo", ended_with_eos=True),
            dict(response="Answer: 33", ground_truth="34", data_source="aime24", ended_with_eos=True),
        ]
    )
    assert rewards == [1.0, 1.0, pytest.approx(2 / 3), 1.0, -1.0]  # DAPO's scorer: +1 / -1
    with pytest.raises(ScorerError, match="no scorer for data_source 'nope'"):
        pool.score_batch([sample("x", data_source="nope")])


def test_custom_scorer_optional_keywords():
    rewards, _ = RewardPool(custom="scorers_for_tests:verl_style", num_workers=0).score_batch(
        [sample("ok"), sample("ok", data_source="other")]
    )
    assert rewards == [1.0, 0.0]  # data_source passed by keyword; the dict's "score" used
    rewards, _ = RewardPool(custom="scorers_for_tests:wants_eos", num_workers=0).score_batch(
        [sample("a", eos=True), sample("a", eos=False)]
    )
    assert rewards == [1.0, 0.0]


@pytest.mark.parametrize(
    "path, message",
    [
        ("scorers_for_tests:two_args", "has signature two_args(answer, truth)"),
        ("scorers_for_tests:missing", "has no function 'missing'"),
        ("scorers_for_tests:not_callable", "has no function 'not_callable'"),
        ("no_such_module_xyz:fn", "cannot import"),
        ("justaname", "not a dotted path"),
    ],
)
def test_custom_scorer_errors_at_load_time(path, message):
    with pytest.raises(ScorerError, match=re.escape(message)) as e:
        RewardPool(custom=path)
    if "signature" in message:
        assert EXPECTED_SIGNATURE in str(e.value)


def test_dotted_path_forms():
    assert load_scorer("scorers_for_tests.exact").fn is load_scorer("scorers_for_tests:exact").fn


def test_from_config():
    cfg = SimpleNamespace(name="gsm8k", custom=None, model_path=None, timeout_s=3.0, num_workers=0)
    pool = RewardPool.from_config(cfg)
    assert pool.score_batch([sample("#### 3", "3")])[0] == [1.0]
    with pytest.raises(ScorerError, match="unknown reward.name 'gsm9k'"):
        RewardPool.from_config(SimpleNamespace(**{**vars(cfg), "name": "gsm9k"}))
    # With a reward model the pool still scores validation answers by reward.name.
    with_model = RewardPool.from_config(SimpleNamespace(**{**vars(cfg), "model_path": "/rm"}))
    assert with_model.score_batch([sample("#### 3", "3")])[0] == [1.0]


def test_workers_do_not_reimport_the_trainers_main(tmp_path):
    """Why the pool starts plain interpreters rather than multiprocessing children (and why pebble, which
    schedules into multiprocessing workers, does not fit): spawn and forkserver children re-import the parent's
    __main__ (the trainer: torch, seconds and hundreds of MB per worker, again after every timeout), and fork
    is unsafe in a process with CUDA/NCCL threads. Here __main__ imports torch; the scoring workers must not."""
    main = tmp_path / "trainer_like_main.py"
    main.write_text(
        "import sys\nimport torch\nfrom distflow.rewards import RewardPool, RewardSample\n"
        "if __name__ == '__main__':\n"
        "    with RewardPool(custom='scorers_for_tests:torch_imported', num_workers=2) as pool:\n"
        "        print(pool.score_batch([RewardSample('x', 'x', 'mine', True)] * 4)[0])\n"
    )
    tests_dir = str(Path(__file__).resolve().parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), tests_dir, os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run([sys.executable, str(main)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0.0, 0.0, 0.0, 0.0]", result.stdout  # no worker had torch imported
