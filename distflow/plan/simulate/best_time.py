"""The cost of a call as calibration measures it: the fastest of a few timed runs after a warm-up."""

import time


def best_seconds(fn, repeats: int = 5) -> float:
    """The fastest of `repeats` runs after one warm-up (the machine is shared: the minimum is the cost)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
