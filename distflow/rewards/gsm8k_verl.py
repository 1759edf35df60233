"""GSM8K scored exactly as verl's default GSM8K scorer (verl.utils.reward_score.gsm8k, method "strict"), so
that rewards compare with published verl baselines on the same model. reward.name=gsm8k_verl.

The rule: only the last 300 characters of the response are read; the answer is the LAST match of
"#### " (one space) followed by a run of digits, ".", "," (optionally led by "-"); its commas are removed and
the result is compared AS A STRING with the ground truth. 1.0 when equal, 0.0 otherwise (verl's
format_score 0), 0.0 when there is no such match. So "####5", "#### $5" and "####  5" have no answer, and
"#### 5." or "#### 5.0" against "5" are wrong: stricter than reward.name=gsm8k (gsm8k.py), on purpose.
One difference, for robustness only: a non-string ground truth (an int from a hand-made file) is compared as
str(ground_truth); verl would compare the string with the int and always score 0.
"""

import re

TAIL_CHARS = 300  # verl reads only the end of the response (its _SOLUTION_CLIP_CHARS)
_MARKED_ANSWER = re.compile(r"#### (-?[0-9.,]+)")


def extract_answer(solution_str: str) -> str | None:
    """The last "#### <digits . ,>" answer in the last TAIL_CHARS characters, commas removed; None if none."""
    answers = _MARKED_ANSWER.findall(solution_str[-TAIL_CHARS:])
    return answers[-1].replace(",", "") if answers else None


def score(solution_str: str, ground_truth, extra_info=None) -> float:
    """1.0 when the extracted answer equals str(ground_truth) character for character, else 0.0."""
    return float(extract_answer(solution_str) == str(ground_truth))
