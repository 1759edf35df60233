"""Scorers with known misbehaviour, imported by dotted path in the reward tests (and in the pool's workers)."""

import os
import time


def exact(solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def misbehaving(solution_str, ground_truth, extra_info=None):
    """Behaves as the response says: 'raise', 'sleep', 'exit' (kills the worker), 'nan', else exact match."""
    if solution_str == "raise":
        raise RuntimeError("scorer bug")
    if solution_str == "sleep":
        time.sleep(60)
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "nan":
        return float("nan")
    return float(solution_str == ground_truth)


def verl_style(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(data_source == "mine" and solution_str == ground_truth), "acc": True}


def wants_eos(solution_str, ground_truth, extra_info=None, **kwargs):
    return float(kwargs["ended_with_eos"])


def two_args(answer, truth):
    return 1.0


not_callable = 3


def torch_imported(solution_str, ground_truth, extra_info=None):
    """1.0 when torch is imported in the process that scores (a clean worker has not imported it)."""
    import sys

    return float("torch" in sys.modules)
