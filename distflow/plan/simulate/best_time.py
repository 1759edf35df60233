"""The cost of a call as calibration measures it: the median of a few timed runs after a warm-up."""

import statistics
import time


def median_seconds(fn, repeats: int = 5) -> float:
    """The median of `repeats` runs after one warm-up run (excluded: first-call allocations, connections).
    The median, not the minimum: the benchmarks and the trainer the profile is compared with report
    medians on the same shared machine, so the calibration describes the same typical run."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_median_seconds(calls: dict, repeats: int = 5) -> dict:
    """{key: median seconds} of several calls whose differences a calibration uses (a decode iteration is
    the difference of two generations, a per-token cost that of two batch sizes): one warm-up run each,
    then `repeats` rounds that run every call once in turn, so that a slow spell of a shared machine lands
    on all of them instead of on one call's block of runs and in the difference."""
    for fn in calls.values():
        fn()
    times: dict = {key: [] for key in calls}
    for _ in range(repeats):
        for key, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(t) for key, t in times.items()}
