"""reward.name=gsm8k_verl: verl's strict GSM8K rule, against hand-picked cases and against a character-scanning
parser written here independently of the scorer's regex, on a few thousand generated responses."""

import random

import pytest

from distflow.rewards import gsm8k, gsm8k_verl
from distflow.rewards.registry import BUILTIN_SCORERS, load_scorer

NUMBER_CHARS = set("0123456789.,")


def reference_answer(response: str) -> str | None:
    """verl's rule by hand: in the last 300 characters, each "#### " followed by an optional "-" and at least
    one of 0-9 . , gives an answer (the run of those characters); the last one counts, commas removed."""
    tail = response[-300:]
    found, i = None, 0
    while i + 5 <= len(tail):
        if tail[i : i + 5] != "#### ":
            i += 1
            continue
        j = i + 5
        start = j + 1 if tail[j : j + 1] == "-" else j  # a "-" with no number after it is no answer
        end = start
        while end < len(tail) and tail[end] in NUMBER_CHARS:
            end += 1
        if end > start:
            found = tail[j:end].replace(",", "")
            i = end
        else:
            i += 1
    return found


def reference_score(response: str, truth: str) -> float:
    return 1.0 if reference_answer(response) == truth else 0.0


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("so #### 1,000", "1000", 1.0),  # commas removed
        ("#### $5", "5", 0.0),  # "$" is not in the number pattern: no answer at all
        ("####5", "5", 0.0),  # the marker needs one space
        ("####  5", "5", 0.0),  # ... exactly one
        ("#### 5.", "5", 0.0),  # "5." is the answer; compared as a string
        ("#### 5.0", "5", 0.0),
        ("#### 5 then #### 6", "6", 1.0),  # the last answer counts
        ("#### 5 then #### 6", "5", 0.0),
        ("no answer here, 5", "5", 0.0),
        ("", "5", 0.0),
        ("#### -3", "-3", 1.0),
        ("#### --3", "-3", 0.0),
        ("#### 5" + "." * 300, "5", 0.0),  # only the last 300 characters are read
        ("x" * 1000 + "#### 5", "5", 1.0),
        ("#### 1,2,3", "123", 1.0),
    ],
)
def test_hand_picked(response, truth, expected):
    assert gsm8k_verl.score(response, truth) == expected
    assert reference_score(response, truth) == expected


def test_stricter_than_the_lenient_scorer():
    for response in ("#### $5", "####5", "#### 5.", "#### 5.00"):
        assert gsm8k.score_strict(response, "5") == 1.0 and gsm8k_verl.score(response, "5") == 0.0


def test_numeric_ground_truth_compares_as_text():
    assert gsm8k_verl.score("#### 72", 72) == 1.0 and gsm8k_verl.score("#### 72.0", 72) == 0.0


def test_generated_responses_agree_with_the_hand_parser():
    rng = random.Random(12)
    pieces = [
        "####",
        "#### ",
        " ",
        "#",
        "$",
        "-",
        ".",
        ",",
        "\n",
        "7",
        "72",
        "1,000",
        "3.5",
        "0",
        "answer",
        "The total is",
        "=",
        "x" * 40,
        "#### 72",
        "#### -7",
        "####72",
        "#### 1,000",
    ]
    truths = ["72", "7", "-7", "1000", "3.5", "0", "1,000", "72."]
    outcomes = {0.0: 0, 1.0: 0}
    for _ in range(3000):
        response = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 20)))
        if rng.random() < 0.3:
            response += "#### " + rng.choice(truths)
        truth = rng.choice(truths)
        expected = reference_score(response, truth)
        assert gsm8k_verl.score(response, truth) == expected, (response, truth)
        assert gsm8k_verl.extract_answer(response) == reference_answer(response), response
        outcomes[expected] += 1
    assert outcomes[1.0] > 200 and outcomes[0.0] > 200, outcomes  # both outcomes well exercised


def test_registered_under_its_name():
    assert load_scorer(BUILTIN_SCORERS["gsm8k_verl"])("#### 4", "4") == 1.0
