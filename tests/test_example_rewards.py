"""The worked example of docs/custom_reward.md, examples/rewards/gsm8k_format_bonus.py, loads under the scorer
contract and scores through a real RewardPool (worker processes), both as a module and as a file path."""

from pathlib import Path

import pytest

from distflow.rewards.pool import RewardPool, RewardSample
from distflow.rewards.registry import load_scorer

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_DIR = REPO / "examples" / "rewards"
FILE_PATH = "examples/rewards/gsm8k_format_bonus.py:score"
# (response, ground truth, ended with EOS) -> reward, by the rules in the example's docstring
CASES = [
    ("3 + 4 = 7, so 7 * 10 = 70.\n#### 70", "70", True, 1.0),
    ("#### 1,000", "1000", True, 1.0),
    ("#### $72.0", "72", True, 1.0),
    ("first #### 5 then corrected #### 6", "6", True, 1.0),
    ("#### 71", "70", True, 0.1),
    ("The answer is 70.", "70", True, 0.0),
    ("#### 70", "70", False, 0.0),
]


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))


def test_module_form_meets_the_contract(on_path):
    scorer = load_scorer("gsm8k_format_bonus:score")
    assert scorer.optional_kwargs == ("ended_with_eos",)  # declared, so the pool passes it
    for response, truth, eos, want in CASES:
        assert scorer(response, truth, None, ended_with_eos=eos) == want, response


def test_scores_in_the_reward_pool_workers(on_path):
    samples = [RewardSample(r, t, "openai/gsm8k", eos) for r, t, eos, _ in CASES]
    with RewardPool(custom="gsm8k_format_bonus:score", num_workers=2, timeout_s=30) as pool:
        rewards, stats = pool.score_batch(samples)
    assert rewards == [want for *_, want in CASES]
    assert stats["reward/errors"] == 0 and stats["reward/timeouts"] == 0


def test_file_path_form(monkeypatch):
    monkeypatch.chdir(REPO)  # a relative file path is relative to the working directory (where torchrun runs)
    try:
        scorer = load_scorer(FILE_PATH)
    except ValueError as err:
        if "not a dotted path" in str(err) or "cannot import module" in str(err):
            pytest.skip(
                f"reward.custom=path/to/file.py:function is not supported by this checkout yet: {err}"
            )
        raise
    assert [scorer(r, t, None, ended_with_eos=e) for r, t, e, _ in CASES] == [w for *_, w in CASES]
