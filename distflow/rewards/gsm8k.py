"""GSM8K-style scoring: the final numeric answer against the reference number.

Two extraction modes (the names follow the common GSM8K evaluation convention):
- strict: only the number after the last "####" marker counts (the format the prompt asks for);
- flexible: the "####" answer if there is one, else the last number anywhere in the response.
Commas, "$" and trailing punctuation (". , ; : !") are stripped; numbers compare by value ("1,000.00" == "1000").
This scorer is lenient on purpose ("####5", "#### $5", "#### 5." all count). For numbers comparable with
verl's GSM8K baselines use reward.name=gsm8k_verl (gsm8k_verl.py), verl's exact rule.
"""

import re
from decimal import Decimal, InvalidOperation

_NUMBER = r"-?\$?\s*[0-9][0-9,]*(?:\.[0-9]+)?"
_MARKED = re.compile(r"####\s*(" + _NUMBER + r")")
_ANY_NUMBER = re.compile(_NUMBER)


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer string found in `solution_str` by `method` ("strict" | "flexible"), normalised, or None."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    marked = _MARKED.findall(solution_str)
    if marked:
        return normalize_number(marked[-1])
    if method == "flexible":
        numbers = _ANY_NUMBER.findall(solution_str)
        if numbers:
            return normalize_number(numbers[-1])
    return None


def normalize_number(text: str) -> str:
    """'$1,234.50' -> '1234.50'; '-$ 5' -> '-5'; '18.' -> '18'."""
    return re.sub(r"[\s,$]", "", str(text)).rstrip(".;:!")


def answers_match(answer: str, ground_truth) -> bool:
    truth = normalize_number(ground_truth)
    if answer == truth:
        return True
    try:
        return Decimal(answer) == Decimal(truth)
    except InvalidOperation:
        return False


def score(solution_str: str, ground_truth, extra_info=None, method: str = "strict") -> float:
    """1.0 when the extracted answer equals `ground_truth` (a number, as text or int), else 0.0."""
    answer = extract_answer(solution_str, method)
    return float(answer is not None and answers_match(answer, ground_truth))


def score_strict(solution_str: str, ground_truth, extra_info=None) -> float:
    return score(solution_str, ground_truth, extra_info, method="strict")


def score_flexible(solution_str: str, ground_truth, extra_info=None) -> float:
    return score(solution_str, ground_truth, extra_info, method="flexible")
