"""tools/prepare_data.py: every mode writes parquet that PromptDataset loads and the scorers accept."""

import json
import runpy
from pathlib import Path

import pytest
from conftest import CharTokenizer

from distflow.data import PromptDataset
from distflow.rewards import RewardPool, RewardSample

TOOL = Path(__file__).parents[2] / "tools" / "prepare_data.py"


@pytest.fixture(scope="module")
def prepare():
    main = runpy.run_path(str(TOOL))["main"]
    return lambda *argv: main([str(a) for a in argv])


def load(path):
    return PromptDataset([path], CharTokenizer())


def test_copy(prepare, tmp_path):
    paths = prepare("copy", "--out", tmp_path, "--digits", 3, "--train", 40, "--test", 10, "--seed", 7)
    train, test = load(paths["train"]), load(paths["test"])
    assert len(train) == 40 and len(test) == 10
    strings = [p.messages[0]["content"] for p in list(train) + list(test)]
    assert len(set(strings)) == 50 and all(len(s) == 3 and s.isdigit() for s in strings)
    assert all(p.ground_truth == p.messages[0]["content"] and p.data_source == "distflow/copy" for p in train)
    again = prepare(
        "copy", "--out", tmp_path / "again", "--digits", 3, "--train", 40, "--test", 10, "--seed", 7
    )
    assert Path(again["train"]).read_bytes() == Path(paths["train"]).read_bytes()
    with pytest.raises(ValueError, match="distinct"):
        prepare("copy", "--out", tmp_path, "--digits", 1, "--train", 8, "--test", 3)


def test_lookup(prepare, tmp_path):
    """The task that needs its tool: the value is in the prompt's own table only, and the row carries the
    demonstration the warm-up imitates; its reward is the copy score of the final answer against the value."""
    paths = prepare("lookup", "--out", tmp_path, "--train", 30, "--test", 5, "--seed", 3)
    train = load(paths["train"])
    assert len(train) == 30 and len(load(paths["test"])) == 5
    for p in train:
        key = p.messages[0]["content"].removeprefix("lookup ")
        assert p.data_source == "distflow/lookup" and p.extra_info["table"] == [
            {"key": key, "value": p.ground_truth}
        ]
        assert p.ground_truth not in p.messages[0]["content"]
        call, answer, final = p.extra_info["sft_turns"]
        assert json.loads(call["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
            "name": "lookup",
            "arguments": {"key": key},
        }
        assert answer == {"role": "tool", "content": p.ground_truth} and final["content"] == p.ground_truth
    assert len({p.ground_truth for p in train}) > 20  # values are random: only the tool knows them
    pool = RewardPool("auto", num_workers=0)
    rewards, _ = pool.score_batch(
        [
            RewardSample("582", "582", "distflow/lookup", True),
            RewardSample("58", "582", "distflow/lookup", True),
        ]
    )
    assert rewards == [1.0, 0.5]


def test_copy_of_many_lengths(prepare, tmp_path):
    """--min-digits: string lengths spread over [min, digits] (responses of many lengths), still distinct."""
    paths = prepare(
        "copy", "--out", tmp_path, "--digits", 6, "--min-digits", 2, "--train", 300, "--test", 20, "--seed", 1
    )
    strings = [p.messages[0]["content"] for p in list(load(paths["train"])) + list(load(paths["test"]))]
    assert len(set(strings)) == 320 and all(s.isdigit() for s in strings)
    assert {len(s) for s in strings} == {2, 3, 4, 5, 6}
    with pytest.raises(ValueError, match="min_digits=5 must be >= 1 and below digits=3"):
        prepare("copy", "--out", tmp_path, "--digits", 3, "--min-digits", 5, "--train", 8, "--test", 2)
    with pytest.raises(ValueError, match="distinct"):
        prepare("copy", "--out", tmp_path, "--digits", 2, "--min-digits", 1, "--train", 90, "--test", 2)


def test_gsm_symbolic(prepare, tmp_path):
    paths = prepare("gsm_symbolic", "--out", tmp_path, "--train", 30, "--test", 10, "--seed", 3)
    train, test = load(paths["train"]), load(paths["test"])
    assert len(train) == 30 and len(test) == 10
    assert not {p.messages[0]["content"] for p in train} & {p.messages[0]["content"] for p in test}
    p = train[0]
    assert p.data_source == "openai/gsm8k" and p.messages[0]["content"].endswith('after "####".')
    # The reference solutions score 1 under reward.name=auto (the gsm8k scorer).
    samples = [RewardSample(q.extra_info["answer"], q.ground_truth, q.data_source, True) for q in train]
    rewards, _ = RewardPool("auto", num_workers=0).score_batch(samples)
    assert rewards == [1.0] * 30


def test_gsm8k_and_math_from_files(prepare, tmp_path):
    gsm = tmp_path / "gsm8k_test.jsonl"
    gsm.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {
                    "question": "Ann has 2 apples and buys 1,000 more. How many?",
                    "answer": "2 + 1000 = 1002\n#### 1,002",
                },
                {"question": "What is 3 times 4?", "answer": "3 * 4 = 12\n#### 12"},
            ]
        )
    )
    rows = load(prepare("gsm8k", "--input", gsm, "--out", tmp_path / "gsm")["test"])
    assert [p.ground_truth for p in rows] == ["1002", "12"] and rows[0].data_source == "openai/gsm8k"

    math = tmp_path / "math.jsonl"
    math.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"problem": "Half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
                {"problem": "2+2?", "solution": "...", "answer": "4"},
            ]
        )
    )
    rows = load(prepare("math", "--input", math, "--split", "train", "--out", tmp_path / "math")["train"])
    assert [p.ground_truth for p in rows] == ["\\frac{1}{2}", "4"]
    assert rows[0].messages[0]["content"].endswith("within \\boxed{}.")


@pytest.mark.slow  # importing `datasets` costs ~4 s of CPU
def test_saved_hf_dataset_dir(prepare, tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"question": "1+1?", "answer": "#### 2"}]),
            "test": datasets.Dataset.from_list([{"question": "2+1?", "answer": "#### 3"}]),
        }
    ).save_to_disk(str(tmp_path / "saved"))
    paths = prepare("gsm8k", "--input", tmp_path / "saved", "--out", tmp_path / "out")
    assert [p.ground_truth for p in load(paths["train"])] == ["2"]
    assert [p.ground_truth for p in load(paths["test"])] == ["3"]
