"""Prints a run's learning curve from RUN_DIR/metrics.jsonl: reward per step, held-out reward and exact
match where the run validated, entropy, and what the numbers mean for the copy task of the main job.

Example: python tools/summarize_run.py outputs/grpo_copy [--every 5]
A step logged twice (a run resumed after a crash) counts once: the later entry wins (as tools/plot_metrics.py).
"""

import argparse
import sys
from pathlib import Path

from plot_metrics import read_metrics  # tools/ is the script's directory, so it is on sys.path

BAR_WIDTH = 40


def summarize(run_dir: Path, every: int = 5) -> list[str]:
    """The lines to print for `run_dir` (also what the tests read)."""
    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        return [f"no metrics at {metrics_file}: the run logged no step (see its console output)"]
    series = {name: dict(points) for name, points in read_metrics(metrics_file).items()}
    rewards = series.get("reward/mean", {})
    if not rewards:
        return [f"{metrics_file} holds no reward/mean: no RL step was logged"]
    steps = sorted(rewards)
    shown = steps[::every] + ([steps[-1]] if (len(steps) - 1) % every else [])
    lines = [f"reward per step ({run_dir}):"]
    for step in shown:
        value = rewards[step]
        line = f"  step {step:4d}  {value:6.3f} {'#' * max(0, int(BAR_WIDTH * value))}"
        held_out = _at_or_before(series.get("val/reward/mean", {}), step)
        if held_out is not None:
            exact = _at_or_before(series.get("val/accuracy", {}), step)
            line += f"   held-out {held_out:.2f}" + (f" (exact {exact:.2f})" if exact is not None else "")
        lines.append(line)
    entropy = series.get("actor/entropy", {})
    if entropy:
        lines.append(
            f"entropy {entropy[min(entropy)]:.2f} (step {min(entropy)}) -> {entropy[max(entropy)]:.2f} "
            f"(step {max(entropy)})"
        )
    return lines


def _at_or_before(values: dict, step: int):
    """The latest value logged at or before `step` (validation runs every trainer.val_every steps)."""
    earlier = [s for s in values if s <= step]
    return values[max(earlier)] if earlier else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run's output directory (trainer.output_dir)")
    parser.add_argument("--every", type=int, default=5, help="print every k-th step (and the last)")
    args = parser.parse_args(argv)
    print("\n".join(summarize(args.run_dir, max(1, args.every))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
