"""val/* metrics from several ranks' tallies: overall, per data_source (names with "/" kept), sample rows."""

import pytest

from distflow.tracking.validation import ValidationTally, validation_metrics


def test_overall_and_per_data_source():
    a, b = ValidationTally(max_rows=2), ValidationTally(max_rows=2)
    for reward in (1.0, 0.0, 0.5):
        a.add("openai/gsm8k", reward, prompt="p", response="r", ground_truth=42)
    b.add("copy", 1.0, prompt="q", response="s", ground_truth="abc")
    metrics, rows = validation_metrics([a, b], max_rows=3)
    assert metrics["val/reward/mean"] == pytest.approx(2.5 / 4)
    assert metrics["val/accuracy"] == pytest.approx(2 / 4)
    assert metrics["val/openai/gsm8k/reward/mean"] == pytest.approx(0.5)
    assert metrics["val/openai/gsm8k/accuracy"] == pytest.approx(1 / 3)
    assert metrics["val/copy/reward/mean"] == 1.0 and metrics["val/copy/accuracy"] == 1.0
    # Rows in turn from each rank, at most max_rows; each rank keeps its first max_rows.
    assert [(r["data_source"], r["reward"]) for r in rows] == [
        ("openai/gsm8k", 1.0),
        ("copy", 1.0),
        ("openai/gsm8k", 0.0),
    ]
    assert rows[1] == {
        "data_source": "copy",
        "prompt": "q",
        "response": "s",
        "ground_truth": "abc",
        "reward": 1.0,
    }


def test_nothing_validated():
    assert validation_metrics([ValidationTally(), ValidationTally()], max_rows=4) == ({}, [])
