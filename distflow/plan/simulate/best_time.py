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
