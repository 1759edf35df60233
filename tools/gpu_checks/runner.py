"""Runs the checks one after another within a time budget; a check that fails records its error and the next
one runs (one GPU run must yield as much as it can). The JSON is rewritten after every check, so a run killed
from outside still leaves the figures of the checks it finished.
"""

import json
import signal
import time
import traceback
from pathlib import Path


class CheckTimeout(Exception):
    pass


def run_checks(checks: list, ctx, results: dict, out_file: Path) -> dict:
    """checks: [(name, estimated seconds, fn(ctx) -> dict)]. results[name] is the check's dict, or
    {"skipped": why} / {"error": ..., "traceback": ...}, plus "seconds"."""
    for name, estimate, fn in checks:
        left = ctx.seconds_left()
        if left < estimate:
            results[name] = {"skipped": f"budget: {left:.0f} s left, the check needs about {estimate} s"}
            write_results(out_file, results)
            continue
        tic = time.monotonic()
        print(f"[gpu_check] {name} (about {estimate} s, {left:.0f} s left)", flush=True)
        try:
            with _alarm(left):
                results[name] = fn(ctx)
        except BaseException as exc:  # noqa: BLE001 - one failing check must not cost the others
            if isinstance(exc, KeyboardInterrupt):
                raise
            results[name] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:],
            }
            print(f"[gpu_check] {name} failed: {results[name]['error']}", flush=True)
        results[name]["seconds"] = time.monotonic() - tic
        write_results(out_file, results)
    return results


class _alarm:
    """Raises CheckTimeout in the main thread once `seconds` have passed (between Python bytecodes)."""

    def __init__(self, seconds: float):
        self.seconds = max(1, int(seconds))

    def __enter__(self):
        def expire(signum, frame):
            raise CheckTimeout(f"the budget ran out after {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)
        return False


def write_results(out_file: Path, results: dict) -> None:
    tmp = out_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str))
    tmp.replace(out_file)
