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


def median_of_launches(measure, launches: int = 3) -> dict:
    """Each number of `measure()`'s result (a dict, nested dicts too) as the median over `launches`
    calls. For measurements that start processes of their own (gloo): on a shared VM one launch's
    processes can land in a slow spell or on a bad placement for all of their rounds (a 2-process
    all_gather_object 0.84 ms in one calibration, 3.11 ms in the next), which no median over the rounds
    of one launch removes."""
    results = [measure() for _ in range(launches)]

    def combine(values: list):
        if isinstance(values[0], dict):
            return {key: combine([v[key] for v in values]) for key in values[0]}
        return statistics.median(values)

    return combine(results)
