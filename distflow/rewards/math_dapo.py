"""DAPO's math reward (arXiv 2503.14476), as its reference scorer computes it (verl's math_dapo), so runs on
DAPO-Math-17k / AIME compare with published DAPO numbers. reward.name=math_dapo; reward.name=auto routes
data_source "math_dapo" and every data_source starting with "aime" (any case) here.

The rule: only the last 300 characters of the response are read; the answer is the text after the LAST
"Answer:" (any case, spaces allowed before the colon) up to the end of its line, which the DAPO prompt asks
for ("The last line of your response should be of the form Answer: $Answer"). Answer and ground truth are
normalised with the Minerva rules (Lewkowycz et al. 2022, appendix: the part after the last "=", units and
filler words removed, the first $...$ kept, \\text{}/\\boxed{} unwrapped, \\frac12 -> \\frac{1}{2}, "1,000"
-> "1000") and compared as strings. No symbolic equivalence and no stripping of a trailing period:
"Answer: 34." is wrong against 34, as in DAPO's scorer.

Reward range: +1.0 correct, -1.0 otherwise (no answer included), DAPO's and verl's values, so the overlong
penalty (up to -overlong_penalty_factor) and logged rewards mean what they mean there. Accuracy is
(reward + 1) / 2; the trainer's val/accuracy counts rewards >= 1 and is right as is.
"""

import re

TAIL_CHARS = 300  # DAPO's scorer reads only the end of the response (the longest MATH-500 answer is 159)
CORRECT, WRONG = 1.0, -1.0
_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)

# Minerva's normalisation, step by step (order matters: "an " before "a ", the spaces before unit words).
_REPLACEMENTS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_DELETED = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
_FIRST_INLINE_MATH = re.compile(r".*?\$(.*?)\$.*")  # keeps the first $...$ of the line
_UNWRAPPED = (
    re.compile(r"\\text\{(.*?)\}"),
    re.compile(r"\\textbf\{(.*?)\}"),
    re.compile(r"\\overline\{(.*?)\}"),
    re.compile(r"\\boxed\{(.*)\}"),
)
_SHORT_FRAC = re.compile(r"frac([^{])(.)")
_SHORT_SQRT = re.compile(r"sqrt([^{])")


def normalize_final_answer(text: str) -> str:
    """Minerva's normalisation of a final answer: 'x = $\\frac12$.' -> '\\frac{1}{2}', '1,000 dollars' -> '1000'."""
    text = text.split("=")[-1]
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    for filler in _DELETED:
        text = text.replace(filler, "")
    text = _FIRST_INLINE_MATH.sub(r"$\1$", text)
    for wrapper in _UNWRAPPED:
        text = wrapper.sub(r"\1", text)
    text = _SHORT_FRAC.sub(r"frac{\1}{\2}", text)
    text = _SHORT_SQRT.sub(r"sqrt{\1}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def extract_answer(solution_str: str) -> str | None:
    """The normalised text after the last "Answer:" in the last TAIL_CHARS characters, or None."""
    answers = _ANSWER_LINE.findall(solution_str[-TAIL_CHARS:])
    return normalize_final_answer(answers[-1]) if answers else None


def score(solution_str: str, ground_truth, extra_info=None) -> float:
    """+1.0 when the answer after the last "Answer:" equals `ground_truth` after normalisation, else -1.0."""
    answer = extract_answer(solution_str)
    return CORRECT if answer is not None and answer == normalize_final_answer(str(ground_truth)) else WRONG
