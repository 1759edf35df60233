"""Validation metrics from the scored held-out answers of every rank: overall and per data_source.

Each engine owner tallies its own answers (ValidationTally.add); the trainer gathers the tallies of all
ranks and `validation_metrics` turns them into
  val/reward/mean, val/accuracy                              over every held-out answer
  val/<data_source>/reward/mean, val/<data_source>/accuracy  per data_source (its name kept, "/" included:
                                                             val/openai/gsm8k/reward/mean)
accuracy being the fraction of answers with reward >= 1 (a fully correct answer under the usual scorers), and
a few sample rows (prompt, response, ground truth, reward) for the tracker's sample table.
"""

import math
from dataclasses import dataclass, field

PERFECT = 1.0  # a reward at least this counts as a correct answer for val/accuracy


@dataclass
class ValidationTally:
    """One rank's held-out answers: per data_source [reward sum, answers, perfect answers], and up to
    `max_rows` sample rows (the first ones scored: greedy validation on fixed prompts, so the same rows each
    time, comparable across steps)."""

    max_rows: int = 0
    by_source: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)

    def add(
        self, data_source: str, reward: float, prompt: str = "", response: str = "", ground_truth=None
    ) -> None:
        totals = self.by_source.setdefault(data_source, [0.0, 0, 0])
        totals[0] += float(reward)
        totals[1] += 1
        totals[2] += float(reward) >= PERFECT
        if len(self.rows) < self.max_rows:
            self.rows.append(
                {
                    "data_source": data_source,
                    "prompt": prompt,
                    "response": response,
                    "ground_truth": str(ground_truth),
                    "reward": float(reward),
                }
            )


def validation_metrics(tallies: list[ValidationTally], max_rows: int) -> tuple[dict[str, float], list[dict]]:
    """The val/* metrics over all ranks' tallies, and up to `max_rows` sample rows taken in turn from each
    rank (so several engines' answers show). Metrics are {} when no rank validated anything."""
    merged: dict[str, list] = {}
    for tally in tallies:
        for source, (total, count, perfect) in tally.by_source.items():
            m = merged.setdefault(source, [[], 0, 0])
            m[0].append(total)
            m[1] += count
            m[2] += perfect
    metrics = {}
    if merged:
        count = sum(m[1] for m in merged.values())
        metrics["val/reward/mean"] = math.fsum(x for m in merged.values() for x in m[0]) / count
        metrics["val/accuracy"] = sum(m[2] for m in merged.values()) / count
    for source, (totals, count, perfect) in sorted(merged.items()):
        metrics[f"val/{source}/reward/mean"] = math.fsum(totals) / count
        metrics[f"val/{source}/accuracy"] = perfect / count
    rows = []
    for i in range(max((len(t.rows) for t in tallies), default=0)):
        rows.extend(t.rows[i] for t in tallies if i < len(t.rows))
    return metrics, rows[:max_rows]
