"""A custom scorer for `reward.custom`: GSM8K's final answer, with partial credit for the asked-for format.

    reward.custom=examples/rewards/gsm8k_format_bonus.py:score        (a file path, as verl's custom_reward_function)
    PYTHONPATH=examples/rewards ... reward.custom=gsm8k_format_bonus:score   (a module on the path)

1.0: the number after the last "####" equals the ground truth (commas and "$" ignored; 72 == 72.0);
0.1: a "#### <number>" answer that is wrong (the model learned the format first);
0.0: no "####" answer, or a response cut at rollout.max_new_tokens (it never finished its answer).
It follows the scorer contract of distflow/rewards/registry.py: keyword arguments solution_str, ground_truth,
extra_info, plus the optional `ended_with_eos` it declares. Pure Python, no imports of DistFlow: a scorer
runs in the reward pool's worker processes, once per response.
"""

import re

FORMAT_BONUS = 0.1
_FINAL_ANSWER = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def _number(text) -> float | None:
    try:
        return float(str(text).replace(",", "").replace("$", "").strip().rstrip("."))
    except ValueError:
        return None


def score(solution_str: str, ground_truth, extra_info=None, ended_with_eos: bool = True) -> float:
    answers = _FINAL_ANSWER.findall(solution_str)
    if not answers or not ended_with_eos:
        return 0.0
    answer, truth = _number(answers[-1]), _number(ground_truth)
    return 1.0 if answer is not None and answer == truth else FORMAT_BONUS
