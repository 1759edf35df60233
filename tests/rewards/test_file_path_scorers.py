"""reward.custom as 'path/to/file.py:function' (verl's custom_reward_function.path): loaded in this process
and, by the same string, in the scorer worker processes."""

import os

import pytest

from distflow.config.dotted_path import load_callable
from distflow.rewards import RewardPool, RewardSample

SCORER = (
    "import os\n"
    "def score(solution_str, ground_truth, extra_info=None):\n"
    "    return float(solution_str == ground_truth) + (0.5 if os.getpid() != {parent} else 0.0)\n"
)


@pytest.fixture
def scorer_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(SCORER.replace("{parent}", str(os.getpid())))
    return path


def test_file_path_scores_in_the_worker_processes(scorer_file):
    samples = [RewardSample("42", "42", "any", True), RewardSample("41", "42", "any", True)]
    with RewardPool(custom=f"{scorer_file}:score", num_workers=1, timeout_s=30) as pool:
        rewards, _ = pool.score_batch(samples)
    assert rewards == [1.5, 0.5]  # +0.5: scored in another process than this one


def test_relative_file_path_and_loaded_once(scorer_file, monkeypatch):
    monkeypatch.chdir(scorer_file.parent)
    first = load_callable("my_reward.py:score", "reward.custom")
    assert first("1", "1") == 1.0
    assert load_callable(f"{scorer_file}:score", "reward.custom") is first  # one module per file


@pytest.mark.parametrize(
    "text, message",
    [
        ("def other(): pass\n", "has no function 'score'"),
        ("raise RuntimeError('broken at import')\n", "importing .* failed: RuntimeError: broken at import"),
    ],
)
def test_bad_file_names_what_went_wrong(tmp_path, text, message):
    path = tmp_path / f"bad_{abs(hash(text))}.py"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_callable(f"{path}:score", "reward.custom")
