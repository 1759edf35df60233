"""A scorer that rewards an untrained model too (the copy task's reward is 0 for random weights), so a few
RL steps from the raw checkpoint have advantages that are not all 0 and move the policy."""


def digits(solution_str, ground_truth, extra_info=None):
    """Digits in the response, a quarter point each, at most 1."""
    return min(sum(c.isdigit() for c in solution_str) / 4.0, 1.0)
