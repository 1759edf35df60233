"""How each step metric is combined over the ranks that recorded it: ONE table, keyed by name pattern.

Every rank records its own metrics (ctx.record); once per step the trainer gathers them all and reduces
each name by what it means:
  max / min       extremes (`*/max`, `*/min`): the largest / smallest value of any rank, never a mean of them
  sum             counts and totals of disjoint shares (tokens generated, reward errors, samples)
  wmean:<name>    a per-rank mean over that rank's samples, weighted by the per-rank count `<name>` (a rank
                  that did not record the count weighs 1: metrics already global on every rank)
  mean            the plain mean over the ranks that recorded it (the default: metrics that are the same on
                  every rank, such as the actor's losses, or whose mean over ranks is what is meant)
The first matching pattern wins. docs/metrics.md lists every metric with its reduction.
"""

import math
import re
from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class Reduction:
    op: str  # "max", "min", "sum", "mean" or "wmean"
    weight: str | None = None  # wmean: the metric holding each rank's count


MAX, MIN, SUM, MEAN = Reduction("max"), Reduction("min"), Reduction("sum"), Reduction("mean")


def _weighted_by(count: str) -> Reduction:
    return Reduction("wmean", count)


# (pattern, reduction); searched in order, the first match wins.
REDUCTIONS: tuple[tuple[re.Pattern, Reduction], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"/max$|_max$", MAX),
        (r"/min$|_min$", MIN),
        # The oldest weights behind any sample; the slowest rank's time is the step's time.
        (r"^rollout/weight_version$", MIN),
        (r"^rollout/trajectory_tokens_max_over_mean$", MAX),  # the most uneven engine's trajectories
        (r"^(rollout|sync)/seconds$|^timing_s/|^sync/phase_s/", MAX),
        (r"^perf/(max_memory_\w+|cpu_memory_used)_gb$", MAX),  # the fullest rank is the one that runs out
        (
            r"^rollout/(tokens|samples|stale_dropped|engine_restarts|tool_errors|env_timeouts|env_errors)$"
            r"|^reward/(errors|timeouts|samples)$|^advantage/samples$",
            SUM,
        ),
        # Rollout / reward means are over each engine owner's own samples: weight by its sample count.
        (
            r"^rollout/(response|prompt)_length/(mean|clip_ratio)$|^rollout/(staleness_mean|partial_fraction)$"
            r"|^rollout/(turns_mean|tool_calls_mean)$"
            r"|^perf/scored_during_generation$",
            _weighted_by("rollout/samples"),
        ),
        (r"^reward/(mean|env_mean)$", _weighted_by("reward/samples")),
        (r"^(advantage|reward/shaped)/mean$", _weighted_by("advantage/samples")),
        (r"^dapo/overlong_penalty$", _weighted_by("rollout/samples")),
    )
)


def reduction_for(name: str) -> Reduction:
    """The reduction of metric `name` (MEAN when no pattern matches)."""
    for pattern, reduction in REDUCTIONS:
        if pattern.search(name):
            return reduction
    return MEAN


def reduce_metrics(per_rank: list[dict]) -> dict[str, float]:
    """Combines one metrics dict per rank (name -> number; a rank may lack names) into one dict, each name
    reduced over the ranks that recorded it as `reduction_for(name)` says."""
    values: dict[str, list[tuple[float, dict]]] = {}
    for metrics in per_rank:
        for name, value in metrics.items():
            values.setdefault(name, []).append((float(value), metrics))
    out = {}
    for name, recorded in values.items():
        r = reduction_for(name)
        xs = [x for x, _ in recorded]
        if r.op == "max":
            out[name] = max(xs)
        elif r.op == "min":
            out[name] = min(xs)
        elif r.op == "sum":
            out[name] = math.fsum(xs)
        elif r.op == "wmean":
            weights = [float(m.get(r.weight, 1.0)) for _, m in recorded]
            total = math.fsum(weights)
            # A step where no rank had samples: the plain mean (of zeros, usually), not a division by 0.
            out[name] = (
                math.fsum(x * w for x, w in zip(xs, weights)) / total
                if total > 0
                else math.fsum(xs) / len(xs)
            )
        else:
            out[name] = math.fsum(xs) / len(xs)
    return out


def reduce_over_ranks(metrics: dict, group=None) -> dict[str, float]:
    """Collective over `group` (default: the world): every rank passes its own metrics and gets the reduced
    dict (reduce_metrics of all of them). One all_gather_object per call: metrics are a few dozen floats."""
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, metrics, group=group)
    return reduce_metrics(gathered)
