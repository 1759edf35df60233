"""Built-in scorers against hand-written cases."""

import pytest

from distflow.rewards import copy_task, gsm8k, math_answer, math_dapo
from distflow.rewards.registry import BUILTIN_SCORERS, ScorerError, auto_scorer_name, scorer_path


@pytest.mark.parametrize(
    "response, truth, strict, flexible",
    [
        ("3 + 4 = 7 apples.\n#### 7", "7", 1, 1),
        ("#### 1,234", "1234", 1, 1),  # thousands separator
        ("#### $18", "18", 1, 1),  # currency
        ("#### 18.", "18", 1, 1),  # trailing period
        ("#### 18;", "18", 1, 1),  # other trailing punctuation
        ("#### 18!", "18", 1, 1),
        ("so it is 18:", "18", 0, 1),
        ("####18.00", "18", 1, 1),  # same value
        ("#### -5", "-5", 1, 1),
        ("#### 5", "-5", 0, 0),
        ("#### 3 ... no wait #### 4", "4", 1, 1),  # the last marker counts
        ("The answer is 72", "72", 0, 1),  # no marker: flexible takes the last number
        ("I got 3, then 12, so 72.", "72", 0, 1),
        ("#### 70 and later 80", "70", 1, 1),  # a marker wins over later numbers
        ("no numbers here", "3", 0, 0),
        ("", "3", 0, 0),
    ],
)
def test_gsm8k(response, truth, strict, flexible):
    assert gsm8k.score_strict(response, truth) == strict
    assert gsm8k.score_flexible(response, truth) == flexible


def test_gsm8k_numeric_ground_truth_and_bad_method():
    assert gsm8k.score("#### 42", 42) == 1.0
    assert gsm8k.extract_answer("x #### $1,000.", "strict") == "1000"
    with pytest.raises(ValueError, match="strict"):
        gsm8k.score("#### 1", "1", method="loose")


@pytest.mark.parametrize(
    "text, boxed",
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),  # nested braces
        ("\\boxed{{a}^{b_{c}}} end", "{a}^{b_{c}}"),
        ("\\fbox{7}", "7"),
        ("$\\boxed 5$", "5"),
        ("\\boxed{unclosed", None),
        ("nothing", None),
    ],
)
def test_last_boxed(text, boxed):
    assert math_answer.last_boxed(text) == boxed


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("Thus \\boxed{\\frac{1}{2}}", "0.5", 1),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1),
        ("\\boxed{1/2}", "\\frac12", 1),
        ("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1),
        ("\\boxed{\\sqrt{4}}", "2", 1),
        ("\\boxed{2x+1}", "1+2x", 1),
        ("\\boxed{\\frac{1}{3}}", "0.5", 0),
        ("\\boxed{\\frac{1}{2}} wait, \\boxed{3}", "\\frac{1}{2}", 0),  # the last box counts
        ("the answer is 1/2", "\\frac{1}{2}", 0),  # unboxed scores 0
        ("\\boxed{6}", "\\boxed{6}", 1),  # boxed ground truth
        ("so \\boxed 5.", "5", 1),  # trailing punctuation is not the answer
        ("$\\boxed 5,$", "5", 1),
        ("\\boxed{5.}", "5", 1),
        ("\\boxed{5}.", "5", 1),
        ("\\boxed{\\frac{1}{2};}", "0.5", 1),
        ("\\boxed 5 .", "5", 1),
        ("\\boxed{5!}", "120", 1),  # "!" stays: a factorial
        ("\\boxed{5!}", "5", 0),
        ("\\boxed{.}", "5", 0),  # nothing left
    ],
)
def test_math(response, truth, expected):
    assert math_answer.score(response, truth) == expected


@pytest.mark.parametrize(
    "response, eos, expected",
    [
        ("1234", True, 5 / 5),
        ("1234", False, 4 / 5),  # cut before EOS
        ("12345", True, 4 / 6),  # one digit too many: EOS misplaced, longer output
        ("1243", True, 3 / 5),
        ("123", True, 3 / 5),  # stops early: EOS at position 3 does not match '4'
        ("", True, 0 / 5),
        ("1234567", False, 4 / 7),
        (" 1234", True, 0 / 6),  # exact characters, no stripping
    ],
)
def test_copy_seq_reward(response, eos, expected):
    assert copy_task.score(response, "1234", ended_with_eos=eos) == pytest.approx(expected)


def test_copy_needs_eos_flag():
    with pytest.raises(TypeError):
        copy_task.score("1234", "1234")


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("Solve... so the total is 34.\nAnswer: 34", "34", 1.0),
        ("Answer: $34$", "34", 1.0),  # the first $...$ is kept, then "$" removed
        ("Answer: \\boxed{34}", "34", 1.0),
        ("answer : 34", "34", 1.0),  # any case, spaces before the colon
        ("Answer: 1,000", "1000", 1.0),
        ("Answer: 34 degrees", "34", 1.0),  # units removed
        ("Answer: x = 5", "5", 1.0),  # the part after the last "="
        ("Answer: \\frac12", "\\frac{1}{2}", 1.0),  # shorthand TeX
        ("Answer: $\\sqrt2$", "\\sqrt{2}", 1.0),
        ("Answer: \\text{(B)}", "(B)", 1.0),
        ("Answer: 33\nAnswer: 34", "34", 1.0),  # the last "Answer:" counts
        ("Answer: 34\nAnswer: 33", "34", -1.0),
        ("Answer: 34 \nmore text", "34", 1.0),  # the answer runs to the end of its line
        ("Answer: 34.", "34", -1.0),  # DAPO does not strip a trailing period
        ("Answer: 0.5", "\\frac{1}{2}", -1.0),  # strings, no symbolic equivalence
        ("The answer is 34", "34", -1.0),  # no "Answer:": wrong, not 0
        ("Answer: 34" + "x" * 300, "34", -1.0),  # only the last 300 characters are read
        ("x" * 1000 + "Answer: 34", "34", 1.0),
        ("", "34", -1.0),
    ],
)
def test_math_dapo(response, truth, expected):
    assert math_dapo.score(response, truth) == expected


def test_math_dapo_normalisation_by_hand():
    assert math_dapo.normalize_final_answer("x = $\\frac12$.") == "\\frac{1}{2}"
    assert math_dapo.normalize_final_answer("$x = \\frac12$.") == "\\frac{1}{2}."  # one "$" left: kept as is
    assert math_dapo.normalize_final_answer("1,000 dollars") == "1000"
    assert math_dapo.normalize_final_answer("90^\\circ") == "90"
    assert math_dapo.normalize_final_answer("\\text{and}") == ","
    assert math_dapo.extract_answer("no marker") is None


@pytest.mark.parametrize(
    "data_source, name",
    [
        ("math_dapo", "math_dapo"),
        ("aime24", "math_dapo"),
        ("aime25", "math_dapo"),
        ("AIME2024", "math_dapo"),
        ("aime_2025", "math_dapo"),
        ("openai/gsm8k", "gsm8k"),
        ("HuggingFaceH4/MATH-500", "math"),
        ("distflow/copy", "copy"),
        ("maths", None),
        ("my_aime", None),
    ],
)
def test_auto_routes_by_data_source(data_source, name):
    assert auto_scorer_name(data_source) == name
    if name is None:
        with pytest.raises(ScorerError, match="names starting with \\['aime'\\]"):
            scorer_path("auto", None, data_source)
    else:
        assert scorer_path("auto", None, data_source) == BUILTIN_SCORERS[name]
