"""dynamic_sampling: DAPO's filter of uninformative prompt groups, refilled by further generation rounds.

Runs on every rank (role "all") where the samples are (the rollout layout). In each round the ranks that
hold samples (engine owners) add the overlong penalty to the rewards and drop every group whose scorer
rewards are all equal (zero advantage: it only dilutes the batch). Whether the job has kept enough groups
is one collective decision: an all_reduce of a small int64 vector (each rank's kept count in its own slot,
plus the round's dropped and generated groups) over all ranks, ranks without samples adding zeros. Every
rank sees the same totals and takes the same branch: stop, or run another round, in which engine owners
draw the next prompt batch from their PromptLoader, generate and score it, and the other ranks only join
the next all_reduce. After algorithm.max_sampling_attempts rounds the step trains on what was kept.

Batch size. More than data.train_batch_size groups kept: trimmed to exactly that many; the quotas per rank
are as even as the counts allow (share_out, computed identically on every rank from the all_reduced
counts, so nothing else is exchanged), each rank keeping its earliest groups. Fewer after the last round:
a partial batch, rounded down to a multiple of dp_unit groups so that its samples split evenly over the
actor's data-parallel ranks (MegatronWorker.train_step needs the same rows on each DP rank; mini-batches
of actor.mini_batch_size prompts still apply, the last one shorter). No group at all: the step ends here
on every rank (SkipStep) and the update is skipped. The metrics record each case.

Sample ids. The rollout worker numbers each generate call's samples and groups from its engine's base id.
A later round's sample and group ids (and the keys of its batch's infos) are therefore shifted past every
earlier round of this step on the same engine, so ids stay unique over the job; the kept batch carries the
infos of exactly its samples.

Metrics (equal on every rank, taken from the collective): dapo/attempts, dapo/kept_groups (trained on),
dapo/dropped_groups (equal rewards, all rounds), dapo/trimmed_groups, dapo/generated_groups,
dapo/partial_batch, dapo/skipped_update; on engine owners dapo/overlong_penalty (mean, first round).
reward/* and the rollout/* length statistics describe the first round only (fresh prompts before any
filtering, the quantity GRPO logs); rollout/tokens, rollout/seconds, reward/errors and reward/timeouts
add up all rounds.
"""

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

from distflow.algorithms.groups import filter_groups_with_variance
from distflow.coordination.data import PackedBatch
from distflow.dag.controller import SkipStep
from distflow.nodes.reward import score_samples
from distflow.nodes.rollout import generate_samples
from distflow.rewards.overlong import shape_overlong
from distflow.workers.rollout.worker import ID_STRIDE

_SUMMED_OVER_ROUNDS = (
    "rollout/tokens",
    "rollout/seconds",
    "rollout/stolen_groups",
    "reward/errors",
    "reward/timeouts",
)


@dataclass
class Round:
    """One generation round on this rank: the samples, the rewards trained on, and the scores the filter
    compares (the scorer's, before shaping; [n] in the samples' order). All None on a rank without samples."""

    samples: Optional[PackedBatch] = None
    rewards: Optional[PackedBatch] = None
    scores: Optional[torch.Tensor] = None


@dataclass
class Collected:
    """What collect_groups returns on one rank; the counts are over all ranks and equal everywhere."""

    samples: Optional[PackedBatch]  # this rank's kept samples (None on a rank without samples)
    rewards: Optional[PackedBatch]
    attempts: int
    kept_groups: int  # groups the step trains on
    kept_before_trim: int
    dropped_groups: int
    generated_groups: int
    target: int

    @property
    def partial(self) -> bool:
        return self.kept_groups < self.target

    @property
    def trimmed_groups(self) -> int:
        return self.kept_before_trim - self.kept_groups


def dp_unit(samples_per_prompt: int, train_dp: int) -> int:
    """The fewest groups whose samples split evenly over train_dp data-parallel ranks."""
    return train_dp // math.gcd(samples_per_prompt, train_dp)


def groups_to_train(kept: int, target: int, unit: int) -> int:
    """target when reached; else the kept groups rounded down to a multiple of `unit` (0 skips the update)."""
    return min(kept, target) // unit * unit


def share_out(counts: list[int], total: int) -> list[int]:
    """Per-rank quotas: each <= its count, summing to min(total, sum(counts)), as even as the counts allow
    (one group at a time to every rank that has one left, lower ranks first). Deterministic, so every rank
    computes the same quotas from the same counts."""
    quotas, left = [0] * len(counts), min(total, sum(counts))
    while left:
        for r, c in enumerate(counts):
            if left and quotas[r] < c:
                quotas[r] += 1
                left -= 1
    return quotas


def collect_groups(
    first: Round,
    draw: Callable[[int], Round],
    target: int,
    max_attempts: int,
    unit: int = 1,
    filter_equal: bool = True,
    group=None,
) -> Collected:
    """The dynamic-sampling loop, collective over `group` (default: all ranks); every rank must call it.

    first: this rank's first round (an empty Round on ranks without samples). draw(attempt): this rank's
    next round (attempt = 2, 3, ...); called on every rank, identically often; sample and group ids must
    not repeat earlier rounds'. target: groups wanted over all ranks. filter_equal=False keeps every group
    (dynamic sampling off: the loop then ends after the first round unless the batch is short).
    """
    if max_attempts < 1:
        raise ValueError(f"algorithm.max_sampling_attempts={max_attempts} must be >= 1")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = _collective_device(group)
    holds = first.samples is not None
    kept_samples, kept_rewards, kept_here = [], [], 0
    dropped = generated = 0
    current, attempt = first, 1
    while True:
        counts = torch.zeros(world + 2, dtype=torch.int64, device=device)
        if current.samples is not None:
            samples, rewards, n_kept, n_dropped = _keep_informative(current, filter_equal)
            kept_samples.append(samples)
            kept_rewards.append(rewards)
            kept_here += n_kept
            counts[world], counts[world + 1] = n_dropped, n_kept + n_dropped
        counts[rank] = kept_here
        dist.all_reduce(counts, group=group)  # the decision every rank takes alike
        per_rank = counts[:world].tolist()
        dropped += int(counts[world])
        generated += int(counts[world + 1])
        if sum(per_rank) >= target or attempt >= max_attempts:
            break
        attempt += 1
        current = draw(attempt)
    final = groups_to_train(sum(per_rank), target, unit)
    samples = rewards = None
    if holds:
        samples, rewards = _earliest_groups(
            PackedBatch.concat(kept_samples),
            PackedBatch.concat(kept_rewards),
            share_out(per_rank, final)[rank],
        )
    return Collected(samples, rewards, attempt, final, sum(per_rank), dropped, generated, target)


def _keep_informative(r: Round, filter_equal: bool) -> tuple[PackedBatch, PackedBatch, int, int]:
    """The round's samples and rewards of groups with differing scores; (kept, dropped) group counts."""
    if not torch.equal(r.samples.sample_ids, r.rewards.sample_ids) or len(r.scores) != len(r.samples):
        raise ValueError("dynamic sampling: rewards and scores must come in the samples' order")
    groups = r.samples.groups
    if filter_equal and len(groups):
        keep = filter_groups_with_variance(r.scores, groups)
    else:
        keep = torch.ones(len(groups), dtype=torch.bool)
    positions = torch.nonzero(keep).reshape(-1)
    n_groups, n_kept = int(groups.unique().numel()), int(groups[keep].unique().numel())
    return r.samples.select(positions), r.rewards.select(positions), n_kept, n_groups - n_kept


def _earliest_groups(
    samples: PackedBatch, rewards: PackedBatch, quota: int
) -> tuple[PackedBatch, PackedBatch]:
    """The samples of the `quota` lowest group ids (later rounds have higher ids: earliest rounds first)."""
    ids, counts = torch.unique(samples.sample_ids, return_counts=True)
    if (counts > 1).any():
        raise RuntimeError(
            f"dynamic sampling: sample id {int(ids[counts > 1][0])} was kept twice; each round's "
            "ids must be shifted past the earlier rounds'"
        )
    chosen = torch.unique(samples.groups)[:quota]
    positions = torch.nonzero(torch.isin(samples.groups, chosen)).reshape(-1)
    return samples.select(positions), rewards.select(positions)


def _collective_device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---- the node ---------------------------------------------------------------------------------------


def dynamic_sampling(ctx, inputs):
    """DAG node: {"samples", "rewards"} of the first round -> {"kept_samples", "kept_rewards"}."""
    cfg, a = ctx.cfg, ctx.cfg.algorithm  # overlong_buffer_len <= max_new_tokens: checked by config validation
    holds = inputs["samples"] is not None
    if holds and ctx.prompt_loader is None:
        raise RuntimeError(
            "dynamic sampling needs this rank's PromptLoader in NodeContext.prompt_loader (the "
            "trainer sets it on engine owners)"
        )

    def shaped(samples, rewards) -> tuple[Round, torch.Tensor]:
        total, penalty = shape_overlong(
            samples, rewards, cfg.rollout.max_new_tokens, a.overlong_buffer_len, a.overlong_penalty_factor
        )
        return Round(samples, total, rewards.fields["rewards"]), penalty

    first, ids = Round(), None
    if holds:
        first, penalty = shaped(inputs["samples"], inputs["rewards"])
        ctx.record(**{"dapo/overlong_penalty": float(penalty.mean()) if len(penalty) else 0.0})
        ids = _RoundIds.after(inputs["samples"], ctx.workers.rollout.engine_index)

    def draw(attempt: int) -> Round:
        if not holds:
            return Round()
        samples, rewards = ids.shift(*_generate_and_score(ctx))
        return shaped(samples, rewards)[0]

    result = collect_groups(
        first,
        draw,
        cfg.data.train_batch_size,
        a.max_sampling_attempts,
        dp_unit(cfg.rollout.n, ctx.cluster.actor.dp),
        filter_equal=a.dynamic_sampling,
    )
    ctx.record(
        **{
            "dapo/attempts": result.attempts,
            "dapo/kept_groups": result.kept_groups,
            "dapo/dropped_groups": result.dropped_groups,
            "dapo/trimmed_groups": result.trimmed_groups,
            "dapo/generated_groups": result.generated_groups,
            "dapo/partial_batch": result.partial,
            "dapo/skipped_update": result.kept_groups == 0,
        }
    )
    if result.kept_groups == 0:
        raise SkipStep(f"dynamic sampling kept no group with differing rewards in {result.attempts} round(s)")
    return {"kept_samples": result.samples, "kept_rewards": result.rewards}


def _generate_and_score(ctx) -> tuple[PackedBatch, PackedBatch]:
    """One more round of the generate and score nodes' work; of its metrics only the _SUMMED_OVER_ROUNDS
    ones are added to the step's (the others describe the first round)."""
    samples, generated = generate_samples(ctx, next(ctx.prompt_loader))
    rewards, scored = score_samples(ctx, samples, streamed=True)
    this_round = {**generated, **scored}
    metrics = ctx.step.metrics
    ctx.record(
        **{key: metrics.get(key, 0.0) + this_round[key] for key in _SUMMED_OVER_ROUNDS if key in this_round}
    )
    return samples, rewards


@dataclass
class _RoundIds:
    """Where the next round's sample and group ids start on this engine (past all earlier rounds)."""

    base: int
    next_sample: int
    next_group: int

    @classmethod
    def after(cls, samples: PackedBatch, engine_index: int) -> "_RoundIds":
        ids = cls(engine_index * ID_STRIDE, 0, 0)
        ids._advance(samples)
        return ids

    def _advance(self, samples: PackedBatch) -> None:
        if len(samples):
            self.next_sample = int(samples.sample_ids.max()) - self.base + 1
            self.next_group = int(samples.groups.max()) - self.base + 1

    def shift(self, samples: PackedBatch, rewards: PackedBatch) -> tuple[PackedBatch, PackedBatch]:
        """The round's batches (and the samples' infos) under ids past the earlier rounds'."""
        ds, dg = self.next_sample, self.next_group
        if len(samples) and (
            int(samples.sample_ids.max()) + ds >= self.base + ID_STRIDE
            or int(samples.groups.max()) + dg >= self.base + ID_STRIDE
        ):
            raise RuntimeError(
                f"dynamic sampling: more than {ID_STRIDE} samples on one engine in one step; lower "
                "algorithm.max_sampling_attempts or data.train_batch_size x rollout.n"
            )
        infos = None if samples.infos is None else {i + ds: info for i, info in samples.infos.items()}
        samples = PackedBatch(
            samples.sample_ids + ds,
            samples.groups + dg,
            samples.lengths,
            samples.fields,
            samples.row_counts,
            infos,
        )
        rewards = PackedBatch(
            rewards.sample_ids + ds, rewards.groups + dg, rewards.lengths, rewards.fields, rewards.row_counts
        )
        self._advance(samples)
        return samples, rewards
