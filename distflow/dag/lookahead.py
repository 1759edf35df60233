"""Bounded staleness: the rollouts of the next rollout.max_staleness steps run while this step trains.

Every rank runs the same schedule, so no rank decides for the others and nothing is sent to agree on it.
At step t, with k = rollout.max_staleness, a rank
  1. takes step t's rollout: generated ahead, or now when none was (the first step, or k = 0);
  2. hands it to the training stage: its data moves from the rollout layout to the training layouts;
  3. runs the rollout stage (dag/stages.py) of every step up to t + k not generated yet, with the engines'
     current weights;
  4. runs the training stage of step t, which ends with the weight sync.
In the disaggregated placement the engine ranks do 3 while the training ranks do 4: generation overlaps
training. k = 0 is lock-step (1, 2, 4); with rollout.stream_chunks its samples reach the training ranks in parts while
they generate, and the old/ref log-prob passes run on them there (dag/streaming.py).

Partial rollouts (rollout.partial): in 3 the engine owners only submit the rollouts ahead to their engines
(RolloutWorker.submit) and go on to 4 at once; step 4's weight sync interrupts them, loads, and continues
them under the new weights (workers/rollout/partial_generation.py). The rest of such a rollout's stage (its
samples collected, scored, its advantages) runs when a step takes it, or before a checkpoint (`settle`).

The staleness bound: a rollout generated at engine weight version v trains at step t under the policy of
version V, the engines' version before step t's sync (the same number on every rank). Step 3 makes V - v
<= k; a rollout that would be older (a run resumed with a smaller bound) is dropped and generated again
from its prompts with the current weights (rollout/stale_dropped).

A rollout's metrics (rollout/*, reward/*, advantage/*) are logged with the step that trains on it, so step
t's rows describe step t's samples whatever k; its nodes' timing_s are logged in the step they ran in.
What is ahead is part of a checkpoint (state_dict): a resumed run trains on the very samples the
uninterrupted run would have.

An engine that dies under a rollout with no live engine to take its prompts (regenerates_lost: the
disaggregated placement) is restarted by its ranks, which mark the rollout lost (RolloutLost) and go on;
rollouts due in the same step after it are marked lost too (the restarted engine serves no weights until
a sync). The step that takes a lost rollout generates it again: every rank hears of the loss in one small
exchange before the hand-off, all sync the actor's current weights into the engines under the current
version (the restarted engine holds model.path's weights until then), and the engine's ranks generate it
with its own seeds. In lock-step that is the rollout's own version, so the run stays exact; a rollout lost
ahead (k > 0) is generated with the newer weights of its taking step (staleness 0), as the weights it was
started with are gone from every rank by then. A submitted rollout (partial) keeps the tokens its requests
had: they continue on the restarted engine (EngineRestarts.restart_engine). A streamed step's early parts are
dropped with their log-probs, and its passes run on the rollout generated again.
"""

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch.distributed as dist

from distflow.dag.controller import RankController, RolloutLost, StepResult
from distflow.dag.stages import ROLLOUT_ROLES, rollout_stage
from distflow.dag.streaming import TrainingStream
from distflow.nodes.context import StepState


@dataclass
class Rollout:
    """One step's rollout stage as this rank ran it."""

    step: int
    prompts: list | None
    """This rank's prompts (engine owners; None elsewhere): generated again if the rollout turns stale."""
    version: int
    """The engines' weight version when it was generated (every rank alike)."""
    outputs: dict[str, Any] = field(default_factory=dict)
    """The stage's outputs on this rank (samples, rewards, outcome advantages, ...)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """What its nodes recorded; logged with the step that trains on it."""
    skipped_at: str | None = None
    """The node that ended it with SkipStep (dynamic sampling found too few groups): nothing to train."""
    submitted: bool = False
    """Partial rollouts: only submitted to the engines; its stage has not run yet."""
    lost: str | None = None
    """Why it was lost on this rank (its engine died under it, or was restarted earlier in the step): the
    step that takes it generates it again. Its stage's later nodes did not run here."""


@dataclass
class _StepRecord:
    """What a step's node runs took on this rank: seconds per node (summed over the rollouts it generated) and
    their spans, each with the step whose data it worked on."""

    timing: dict[str, float] = field(default_factory=dict)
    spans: list[dict] = field(default_factory=list)

    def add(self, result: StepResult, for_step: int) -> None:
        for node_id, seconds in result.timing_s.items():
            self.timing[node_id] = self.timing.get(node_id, 0.0) + seconds
        self.spans += [{**span, "for_step": for_step} for span in result.spans]


class LookaheadRollout:
    """Runs one RL step at a time (`step`, collective) under the bound rollout.max_staleness."""

    def __init__(
        self,
        controller: RankController,
        ctx,
        loader,
        max_staleness: int,
        total_steps: int,
        partial: bool = False,
        stream: Optional[TrainingStream] = None,
        regenerates_lost: bool = False,
    ):
        """regenerates_lost (nodes/rollout.regenerates_on_take, alike on every rank): rollouts lost with a
        dead engine are generated again when taken; every step then exchanges whether its rollout was."""
        self.controller, self.ctx, self.loader = controller, ctx, loader
        self.max_staleness, self.total_steps, self.partial = max_staleness, total_steps, partial
        self.stream, self.regenerates_lost = stream, regenerates_lost
        stage = set(rollout_stage(controller.pipeline))
        self.rollout_nodes = [n for n in controller.order if n.id in stage]
        self.training_nodes = [n for n in controller.order if n.id not in stage]
        self.ahead: dict[int, Rollout] = {}

    def step(self, step: int) -> StepResult:
        """Step `step` on this rank: its rollout handed to training, the rollouts ahead generated, then its
        training stage. Records the step's rollout metrics, staleness and idle ratios into ctx.step."""
        start, record = time.perf_counter(), _StepRecord()
        streamed = self._open_stream(step, record) if self.stream is not None else None
        try:
            rollout = self._take(step, record)
        finally:
            self.ctx.samples_stream = None
        self.ctx.step.metrics.update(rollout.metrics)
        if rollout.skipped_at is not None:
            return StepResult(rollout.outputs, record.timing, rollout.skipped_at, record.spans)
        handing, wall = time.perf_counter(), time.time()
        with (
            self.controller.mover.placed(self.stream.layout, streamed.placement)
            if streamed is not None
            else contextlib.nullcontext()
        ):
            self.controller.hand_off(rollout.outputs, self.training_nodes)
        seconds = time.perf_counter() - handing
        record.add(StepResult({}, {"hand_off": seconds}, spans=[_span("hand_off", wall, seconds)]), step)
        self._generate_ahead(step, record)
        result = self.controller.run_nodes(self.training_nodes, rollout.outputs)
        record.add(result, step)
        self._record_idle(record.timing, time.perf_counter() - start)
        return StepResult(result.outputs, record.timing, result.skipped_at, record.spans)

    def _generate_ahead(self, step: int, record: _StepRecord) -> None:
        """The rollouts of the steps up to step + k not generated yet (submitted, with partial rollouts)."""
        lost = None  # why a rollout of this step was lost: the later ones are too
        for ahead in range(step + 1, min(step + self.max_staleness, self.total_steps) + 1):
            if ahead in self.ahead:
                continue
            prompts = self._next_prompts()
            if self.partial:
                self.ahead[ahead] = self._submit(ahead, prompts)
            elif lost is not None:  # the restarted engine serves no trained weights until the next sync
                version = self.ctx.workers.rollout.weight_version
                self.ahead[ahead] = Rollout(ahead, prompts, version, lost=lost)
            else:
                self.ahead[ahead] = self._generate(ahead, prompts, record)
                if self.ahead[ahead].lost is not None:
                    lost = f"its engine restarted in step {ahead}'s rollout ({self.ahead[ahead].lost})"

    def _open_stream(self, step: int, record: _StepRecord):
        """rollout.stream_chunks: step's samples start for the training ranks, which run their log-prob
        passes on the parts as they arrive (dag/streaming.py); filed as timing_s/stream_logprobs."""

        def record_span(name: str, begin: float, end: float, **extra) -> None:
            span = {"node": name, "start": begin, "end": end, **extra}
            record.add(StepResult({}, {name: end - begin}, spans=[span]), step)

        return self.stream.begin(self.ctx, record_span)

    def _take(self, step: int, record: _StepRecord) -> Rollout:
        """Step `step`'s rollout, within the bound; records its staleness on the ranks holding samples."""
        rollout = self.ahead.pop(step, None)
        current = self.ctx.workers.rollout.weight_version
        dropped = 0.0
        if rollout is not None and current - rollout.version > self.max_staleness:
            if rollout.submitted:
                self.ctx.workers.rollout.cancel(step)
            dropped = rollout.metrics.get("rollout/samples", 0.0)
            rollout = self._generate(step, rollout.prompts, record)
        elif rollout is not None and rollout.submitted:
            rollout = self._generate(step, rollout.prompts, record, version=rollout.version)
        elif rollout is None:
            rollout = self._generate(step, self._next_prompts(), record)
        if self.regenerates_lost:
            rollout = self._regenerate_if_lost(rollout, record)
        # the samples the step trains on: with dynamic sampling, those kept over its rounds (its first round's
        # may be none, lost with its engine: nodes/dynamic_sampling.py)
        samples = rollout.outputs.get("kept_samples")
        if samples is None:
            samples = rollout.outputs.get("samples")
        if samples is not None and samples.infos:
            staleness = [current - info.weight_version for info in samples.infos.values()]
            rollout.metrics.update(
                {
                    "rollout/staleness_mean": sum(staleness) / len(staleness),
                    "rollout/staleness_max": float(max(staleness)),
                    "rollout/stale_dropped": dropped,
                }
            )
        return rollout

    def _generate(self, step: int, prompts, record: _StepRecord, version: int | None = None) -> Rollout:
        """The rollout stage of `step` with the engines' current weights (its sampling seeds are step's); of
        a submitted rollout (partial), with `version` the engines' version at its submission."""
        training_state, self.ctx.step = self.ctx.step, StepState(step)
        try:
            if version is None:
                version = self.ctx.workers.rollout.weight_version
            result = self.controller.run_nodes(self.rollout_nodes, {"prompts": prompts})
            lost = str(result.skip) if isinstance(result.skip, RolloutLost) else None
            skipped_at = None if lost is not None else result.skipped_at
            rollout = Rollout(step, prompts, version, result.outputs, self.ctx.step.metrics, skipped_at)
            rollout.lost = lost
        finally:
            self.ctx.step = training_state
        record.add(result, step)
        return rollout

    def _regenerate_if_lost(self, rollout: Rollout, record: _StepRecord) -> Rollout:
        """Collective: `rollout`, or, when any rank lost it, the same step generated again after every rank
        has synced the actor's current weights into the engines under the current version (repeated while
        engines die, within rollout.engine_restarts: a death past them stops the job in the generate node)."""
        while True:
            reasons = [None] * dist.get_world_size()
            dist.all_gather_object(reasons, rollout.lost)
            lost = [(rank, why) for rank, why in enumerate(reasons) if why]
            if not lost:
                return rollout
            if dist.get_rank() == 0:
                rank, why = lost[0]
                current = self.ctx.workers.rollout.weight_version
                weights = (
                    "the weights it was started with: the same samples"
                    if current == rollout.version
                    else f"newer weights than the version {rollout.version} it was started with"
                )
                print(
                    f"[rollout] step {rollout.step}'s rollout was lost (rank {rank}: {why}); every engine loads "
                    f"the actor's weights of version {current} again and the rollout is generated again, with "
                    f"{weights}",
                    flush=True,
                )
            self.ctx.weight_sync.resync()
            # A streamed step's early log-probs are of samples that may come out otherwise (the same in
            # lock-step on a deterministic engine; nothing promises that): the passes run on the new ones.
            streamed = self.ctx.step.streamed_logprobs
            self.ctx.step.streamed_logprobs = {role: {} for role in streamed}
            rollout = self._generate(rollout.step, rollout.prompts, record)

    def _submit(self, step: int, prompts) -> Rollout:
        """Partial rollouts: step's requests sent to the engines (owners), its stage left for later."""
        try:
            self.ctx.workers.rollout.submit(prompts or [], self.ctx.tokenizer.eos_token_id, step)
        except Exception as exc:  # outside any node: the other ranks must hear of it as of a node's failure
            self.controller.report("generate", exc)
            raise
        return Rollout(step, prompts, self.ctx.workers.rollout.weight_version, submitted=True)

    def settle(self) -> None:
        """Runs the stage of every submitted rollout (collective, every rank alike): before a checkpoint, so
        it saves their samples. Their remaining tokens are sampled with the weights they would have had.
        One lost with its engine, the later ones are too (the restarted engine serves no weights until a
        sync): the steps that take them generate them again, their requests continued on the new engine."""
        lost = None
        for step in sorted(self.ahead):
            rollout = self.ahead[step]
            if not rollout.submitted:
                continue
            if lost is not None:
                self.ahead[step] = Rollout(step, rollout.prompts, rollout.version, lost=lost)
                continue
            self.ahead[step] = self._generate(step, rollout.prompts, _StepRecord(), version=rollout.version)
            if self.ahead[step].lost is not None:
                lost = f"its engine restarted in step {step}'s rollout ({self.ahead[step].lost})"

    def _next_prompts(self):
        return next(self.loader) if self.loader is not None else None

    def _record_idle(self, timing: dict, step_s: float) -> None:
        """perf/engine_idle_ratio on engine owners (not with partial rollouts), perf/trainer_idle_ratio on
        training ranks: the share of the step not spent in this rank's own work (generation and scoring; the
        Megatron passes). Waiting for data and the weight sync count as idle on both sides."""
        busy = {"engine": 0.0, "trainer": timing.get("stream_logprobs", 0.0)}
        for node in self.controller.order:
            if node.role != "all" and self.controller.runs(node) and node.id in timing:
                busy["engine" if node.role in ROLLOUT_ROLES else "trainer"] += timing[node.id]
        workers = self.ctx.workers
        # Partial rollouts generate while the engine rank waits in the sync: its node times do not show that.
        if workers.rollout is not None and workers.rollout.owner and not self.partial:
            self.ctx.record(**{"perf/engine_idle_ratio": max(0.0, 1.0 - busy["engine"] / step_s)})
        if workers.actor is not None:
            self.ctx.record(**{"perf/trainer_idle_ratio": max(0.0, 1.0 - busy["trainer"] / step_s)})

    def state_dict(self) -> dict:
        """The rollouts generated ahead on this rank (their samples, metrics and versions); submitted ones
        must be settled first."""
        if any(rollout.submitted for rollout in self.ahead.values()):
            raise RuntimeError("LookaheadRollout.state_dict: settle() the submitted rollouts first")
        return {"max_staleness": self.max_staleness, "ahead": dict(self.ahead)}

    def load_state_dict(self, state: dict | None) -> None:
        self.ahead = dict(state["ahead"]) if state else {}


def _span(node: str, start: float, seconds: float) -> dict:
    return {"node": node, "start": start, "end": start + seconds}
