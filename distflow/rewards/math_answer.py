"""MATH-style scoring: the last \\boxed{...} answer, equivalence decided by math-verify.

Extraction is ours (the last \\boxed{} or \\fbox{}, nested braces balanced); equivalence is math-verify's
(symbolic and numeric: "\\frac{1}{2}" == "0.5" == "1/2", "\\sqrt{4}" == "2", sets, intervals, ...).
Trailing sentence punctuation inside the box ("\\boxed 5." or "\\boxed{5,}") is not part of the answer and is
stripped, except "!", which math-verify reads as a factorial ("5!" == 120).
A response without a boxed answer scores 0. Importing this module imports math-verify (about a second); the
registry imports scorer modules only when a scorer is loaded.
"""

import functools

from math_verify import parse, verify

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_TRAILING_PUNCTUATION = ".,;:"  # not "!": a factorial


def strip_trailing_punctuation(answer: str) -> str:
    """'5.' -> '5', '5 ,;' -> '5'; '5!' stays (a factorial)."""
    return answer.rstrip().rstrip(_TRAILING_PUNCTUATION + " ").rstrip()


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or "\\boxed 5") in `text`; None when there is none
    or its braces never close."""
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    i = start + len(command)
    if text.startswith(" ", i):  # "\boxed 5": the argument runs to the next whitespace or "$"
        rest = text[i + 1 :]
        end = min([len(rest)] + [rest.find(s) for s in (" ", "$", "\n") if s in rest])
        return rest[:end] or None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


@functools.lru_cache(maxsize=4096)
def _parse_gold(ground_truth: str):
    # Wrapping in \boxed{} makes math-verify read the whole string as one LaTeX answer ("\frac12" alone,
    # without $...$, parses to nothing).
    return parse(f"\\boxed{{{ground_truth}}}")


def is_equivalent(answer: str, ground_truth: str) -> bool:
    if answer.strip() == ground_truth.strip():
        return True
    gold = _parse_gold(ground_truth)
    predicted = parse(f"\\boxed{{{answer}}}")
    return bool(gold and predicted and verify(gold, predicted))


def score(solution_str: str, ground_truth, extra_info=None) -> float:
    """1.0 when the last boxed answer of `solution_str` is equivalent to `ground_truth` (LaTeX or plain text)."""
    boxed = last_boxed(solution_str)
    answer = strip_trailing_punctuation(boxed) if boxed is not None else ""
    if not answer:
        return 0.0
    truth = str(ground_truth)
    boxed_truth = last_boxed(truth)  # some datasets store the whole "\boxed{...}" as the ground truth
    return float(is_equivalent(answer, boxed_truth if boxed_truth is not None else truth))
