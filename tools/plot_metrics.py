"""Draws a run's reward, accuracy, response-length, entropy, KL and throughput curves from metrics.jsonl as PNGs.

Example: python tools/plot_metrics.py outputs/run            # writes outputs/run/plots/*.png
A panel whose metrics the run never logged is skipped. When a step was logged twice (a resumed run), the
later entry wins.
"""

import argparse
import json
import re
import sys
from pathlib import Path

# panel -> (title, y label, which metric names it shows). Each pattern finds DistFlow's names and their verl
# twins (tracking.metric_names=verl), and validation per data_source (val/<data_source>/..., "/" allowed).
PANELS = {
    "reward": ("Reward", "reward", re.compile(r"^(reward|critic/score)/mean$|^val/(.+/)?reward/mean$")),
    "accuracy": ("Validation accuracy (reward >= 1)", "fraction", re.compile(r"^val/(.+/)?accuracy$")),
    "response_length": (
        "Response length",
        "tokens",
        re.compile(r"^(rollout/)?response_length/(mean|max|min)$"),
    ),
    "entropy": ("Policy entropy", "nats/token", re.compile(r"^actor/entropy$")),
    "kl": ("KL", "KL", re.compile(r"^actor/.*kl")),
    "throughput": ("Throughput", "tokens/s/GPU", re.compile(r"^perf/throughput$")),
}


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] sorted by step; torn or non-JSON lines are skipped."""
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (ValueError, KeyError, TypeError):
            continue
        by_step.setdefault(step, {}).update(record)  # a later line for the same step wins
    series: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(by_step):
        for key, value in by_step[step].items():
            if key not in ("step", "time") and isinstance(value, (int, float)):
                series.setdefault(key, []).append((step, value))
    return series


def plot(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Writes one PNG per panel that has data; returns their paths."""
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_metrics needs matplotlib: pip install matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        sys.exit(f"no metrics file at {metrics_file}")
    series = read_metrics(metrics_file)
    out_dir = out_dir or run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for panel, (title, ylabel, pattern) in PANELS.items():
        names = sorted(k for k in series if pattern.search(k))
        if not names:
            print(f"{panel}: no metrics matching {pattern.pattern!r}, skipped")
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for name in names:
            steps, values = zip(*series[name])
            ax.plot(steps, values, label=name, marker="." if len(steps) < 50 else None)
        ax.set(title=f"{title} ({run_dir.name})", xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{panel}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
        print(f"{panel}: {path}")
    return written


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run's output directory (trainer.output_dir)")
    parser.add_argument("--out", type=Path, help="where to write the PNGs (default RUN_DIR/plots)")
    args = parser.parse_args(argv)
    return plot(args.run_dir, args.out)


if __name__ == "__main__":
    main()
