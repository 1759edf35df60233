"""dynamic_sampling: DAPO's filter of uninformative prompt groups, refilled by further generation rounds.

Runs on every rank (role "all") where the samples are (the rollout layout). In each round the ranks that
hold samples (engine owners) add the overlong penalty to the rewards and drop every group whose scorer
rewards are all equal (zero advantage: it only dilutes the batch). Whether the job has kept enough groups
is one collective decision: an all_reduce of a small int64 vector (each rank's kept count in its own slot,
plus the round's dropped and generated groups) over all ranks, ranks without samples adding zeros. Every
rank sees the same totals and takes the same branch: stop, or run another round, in which engine owners
draw the next prompt batch from their PromptLoader, generate and score it, and the other ranks only join
the next all_reduce. After algorithm.max_sampling_attempts rounds the step trains on what was kept.

An engine that dies under a round (training-only ranks: nodes/rollout.regenerates_in_rounds; where every
rank owns an engine, the generation itself recovers) is restarted by its owner, and its rank reports the
round lost in the same all_reduce. Every rank then syncs the actor's weights into the engines again under
the same version (nothing has trained since, in lock-step) and the lost round's prompts are generated
again with their seeds and ids: the step keeps the samples it would have had, and the round is not counted
as an attempt. An engine restarted under a round that other engines finished (balanced chunks) also needs
its weights before the next round: that resync runs before the next draw.

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
    lost: bool = False
    """Its generation died with its engine: drawn again (redraw) after every rank resynced."""
    engine_needs_weights: bool = False
    """This rank's engine was restarted (or is dead) and serves no weights until a sync."""


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
    resync: Optional[Callable[[], None]] = None,
    redraw: Optional[Callable[[bool], Round]] = None,
) -> Collected:
    """The dynamic-sampling loop, collective over `group` (default: all ranks); every rank must call it.

    first: this rank's first round (an empty Round on ranks without samples). draw(attempt): this rank's
    next round (attempt = 2, 3, ...); called on every rank, identically often; sample and group ids must
    not repeat earlier rounds'. target: groups wanted over all ranks. filter_equal=False keeps every group
    (dynamic sampling off: the loop then ends after the first round unless the batch is short).
    resync() (collective) and redraw(lost): after a round any rank lost (Round.lost), every rank resyncs
    and calls redraw with whether its own round was lost: its round again (the same prompts and ids), or
    an empty Round; the redrawn round counts as the lost one's attempt. A round whose engine needs weights
    (Round.engine_needs_weights) has every rank resync before the next draw.
    """
    if max_attempts < 1:
        raise ValueError(f"algorithm.max_sampling_attempts={max_attempts} must be >= 1")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = _collective_device(group)
    holds = first.samples is not None or first.lost  # a lost first round is drawn again
    kept_samples, kept_rewards, kept_here = [], [], 0
    dropped = generated = 0
    current, attempt = first, 1
    while True:
        # [each rank's kept groups..., dropped, generated, rounds lost, engines needing weights]
        counts = torch.zeros(world + 4, dtype=torch.int64, device=device)
        if current.samples is not None:
            samples, rewards, n_kept, n_dropped = _keep_informative(current, filter_equal)
            kept_samples.append(samples)
            kept_rewards.append(rewards)
            kept_here += n_kept
            counts[world], counts[world + 1] = n_dropped, n_kept + n_dropped
        counts[rank] = kept_here
        counts[world + 2], counts[world + 3] = int(current.lost), int(current.engine_needs_weights)
        dist.all_reduce(counts, group=group)  # the decision every rank takes alike
        per_rank = counts[:world].tolist()
        dropped += int(counts[world])
        generated += int(counts[world + 1])
        lost, needs_weights = int(counts[world + 2]), int(counts[world + 3])
        finished = sum(per_rank) >= target or attempt >= max_attempts
        if lost or (needs_weights and not finished):
            if resync is None:
                raise RuntimeError("dynamic sampling: a round was lost with its engine and nothing resyncs")
            resync()
        if lost:
            current = redraw(current.lost)
            continue
        if finished:
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
    rollout = ctx.workers.rollout
    lost_prompts, ctx.step.lost_prompts = ctx.step.lost_prompts, None  # round 1's, if its engine died
    holds = inputs["samples"] is not None or lost_prompts is not None
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

    first, ids, first_recorded = Round(), None, False
    if inputs["samples"] is not None:
        first, penalty = shaped(inputs["samples"], inputs["rewards"])
        ctx.record(**{"dapo/overlong_penalty": float(penalty.mean()) if len(penalty) else 0.0})
        ids, first_recorded = _RoundIds.after(inputs["samples"], rollout.engine_index), True
    elif lost_prompts is not None:
        first, ids = Round(lost=True), _RoundIds.after(None, rollout.engine_index)
    if holds:
        first.engine_needs_weights = rollout.needs_weights()

    def generated_round(prompts) -> Round:
        """A round on `prompts`: scored and shaped, or lost with its engine (its prompts kept for redraw)."""
        nonlocal first_recorded
        samples, rewards = _generate_and_score(ctx, prompts, all_metrics=not first_recorded)
        if samples is None:  # the engine died under it (nodes/rollout.generate_samples kept the prompts)
            return Round(lost=True, engine_needs_weights=True)
        round_, penalty = shaped(*ids.shift(samples, rewards))
        if not first_recorded:  # round 1 generated again: its metrics are the first round's
            ctx.record(**{"dapo/overlong_penalty": float(penalty.mean()) if len(penalty) else 0.0})
            first_recorded = True
        round_.engine_needs_weights = rollout.needs_weights()
        return round_

    def draw(attempt: int) -> Round:
        return generated_round(next(ctx.prompt_loader)) if holds else Round()

    def redraw(lost: bool) -> Round:
        nonlocal lost_prompts
        if not lost:
            return Round()
        # a later round's, kept by generate_samples; else round 1's, kept above
        prompts = ctx.step.lost_prompts if ctx.step.lost_prompts is not None else lost_prompts
        ctx.step.lost_prompts = lost_prompts = None
        print(
            f"[dapo] rank {ctx.rank}: step {ctx.step.step}'s generation round lost with engine "
            f"{rollout.engine_index} is generated again ({len(prompts)} prompts)",
            flush=True,
        )
        return generated_round(prompts)

    result = collect_groups(
        first,
        draw,
        cfg.data.train_batch_size,
        a.max_sampling_attempts,
        dp_unit(cfg.rollout.n, ctx.cluster.actor.dp),
        filter_equal=a.dynamic_sampling,
        resync=ctx.weight_sync.resync,
        redraw=redraw,
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


def _generate_and_score(
    ctx, prompts, all_metrics: bool = False
) -> tuple[PackedBatch | None, PackedBatch | None]:
    """One more round of the generate and score nodes' work on `prompts` (no samples: lost with its
    engine); of its metrics only the _SUMMED_OVER_ROUNDS ones are added to the step's (the others describe
    the first round), or all of them (all_metrics: round 1 generated again)."""
    samples, generated = generate_samples(ctx, prompts)
    rewards, scored = score_samples(ctx, samples, streamed=True)
    this_round = {**generated, **scored}
    metrics = ctx.step.metrics
    if all_metrics:
        ctx.record(**this_round)
    else:
        ctx.record(
            **{
                key: metrics.get(key, 0.0) + this_round[key]
                for key in _SUMMED_OVER_ROUNDS
                if key in this_round
            }
        )
    return samples, rewards


@dataclass
class _RoundIds:
    """Where the next round's sample and group ids start on this engine (past all earlier rounds)."""

    base: int
    next_sample: int
    next_group: int

    @classmethod
    def after(cls, samples: PackedBatch | None, engine_index: int) -> "_RoundIds":
        """Past `samples` (None: a lost first round, whose ids its redraw takes)."""
        ids = cls(engine_index * ID_STRIDE, 0, 0)
        if samples is not None:
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
