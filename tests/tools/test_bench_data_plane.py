"""tools/bench_data_plane.py: its processes keep the memory they free (KEEP_FREED_MEMORY), so the
baseline's rounds after the warm-up run on pages rank 0 already has instead of faulting them in again
(which made a round take 50 to 110 ms at 4 and 8 ranks, as the previous rounds had left the heap)."""

import re
import statistics
import sys

from distflow.testing.launch import REPO_ROOT, run


def test_the_baseline_rounds_after_the_warm_up_touch_no_new_pages():
    out = run(
        [sys.executable, str(REPO_ROOT / "tools" / "bench_data_plane.py"), "--ranks", "2", "--repeats", "5"],
        timeout_s=300,
        env={"BENCH_TIMELINE": "1"},
    )
    faults = [int(f) for f in re.findall(r"^rank 0 baseline .* page_faults=(\d+)$", out, re.M)]
    assert len(faults) == 6, out  # the warm-up round and 5 timed ones
    # The batch is 39 MB (9.5 k pages of 4 KiB); rank 0 receives half of it, then makes and sends the whole.
    # The warm-up round touches all of that for the first time; glibc's defaults had every later round map
    # the 39 MB share anew (9.6 k faults a round).
    assert faults[0] > 9000, faults
    assert statistics.median(faults[1:]) < 3000, faults  # 0-1.7 k seen here, 9.6 k without the setting
