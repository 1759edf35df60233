"""The RL trainer every rank runs: build the workers, then walk the DAG once per step.

No rank drives the others: each builds its own share (its Megatron shard, the engine it owns, its data
partition), runs the same DAG with its own controller, and the only cross-rank traffic is data moving
between layouts, the weight sync and one small all-gather of metrics per step for logging.

Reading order: `run` (the whole life of a run), `Trainer.build` (what a rank holds), `resume_or_warm_up`
(where step 1 starts from), `train` (the loop), `step` (one step: the DAG of dag/builtin.py, its rollout
stage run ahead within rollout.max_staleness by dag/lookahead.py, then its metrics).
"""

import dataclasses
import time
from pathlib import Path

import torch

from distflow import distributed
from distflow.checkpointing import Checkpointer
from distflow.coordination.data import DataCoordinator
from distflow.dag.controller import RankController
from distflow.dag.data_mover import CoordinatorMover
from distflow.dag.failure import FailureSignal
from distflow.dag.loading import load_pipeline
from distflow.dag.lookahead import LookaheadRollout
from distflow.dag.roles import ranks_of_role
from distflow.dag.streaming import TrainingStream
from distflow.nodes.context import NodeContext, StepState
from distflow.nodes.rollout import regenerates_on_take
from distflow.nodes.sync import WeightSync
from distflow.nodes.validation import validate
from distflow.nodes.warmup import reference_from_actor, sft_warmup
from distflow.run_context import RunContext
from distflow.tracking.perf import memory_metrics
from distflow.tracking.profiling import StepProfiler
from distflow.tracking.reduce import reduce_over_ranks
from distflow.tracking.timeline import Timeline
from distflow.tracking.tracker import Tracker
from distflow.trainer_setup import Prompts, actor_mfu, build_workers, load_prompts, load_tokenizer
from distflow.workers.megatron.hf_io import save_hf_checkpoint


def run(run_ctx: RunContext) -> None:
    """An RL run on this rank, from the built workers to the exported actor."""
    trainer = Trainer.build(run_ctx)
    try:
        trainer.resume_or_warm_up()
        trainer.train()
        trainer.export_hf()
    finally:
        trainer.close()


class Trainer:
    def __init__(
        self,
        run_ctx: RunContext,
        ctx: NodeContext,
        controller: RankController,
        prompts: Prompts,
        tracker: Tracker,
        checkpointer: Checkpointer,
        coordinator: DataCoordinator,
        failure: FailureSignal,
    ):
        self.run_ctx, self.cfg, self.ctx, self.controller = run_ctx, run_ctx.cfg, ctx, controller
        self.prompts, self.tracker, self.checkpointer = prompts, tracker, checkpointer
        self.coordinator, self.failure = coordinator, failure
        r = self.cfg.rollout
        stream = TrainingStream.build(self.cfg, controller, coordinator)
        if stream is not None:
            run_ctx.log(
                f"rollout.stream_chunks={r.stream_chunks}: the samples reach the training ranks in "
                f"{r.stream_chunks} parts, {r.stream_chunks - 1} of them while the engines generate; the "
                f"log-prob passes of {' and '.join(stream.roles)} run on each part as it arrives"
            )
        self.rollouts = LookaheadRollout(
            controller,
            ctx,
            prompts.loader,
            r.max_staleness,
            self.cfg.trainer.total_steps,
            r.partial,
            stream=stream,
            regenerates_lost=regenerates_on_take(self.cfg, run_ctx.cluster.placement),
        )
        workers = ctx.workers
        # What a checkpoint holds: the trained roles, and the reference when it is the warmed-up actor's copy
        # (model.path does not hold that one).
        roles = {"actor": workers.actor, "critic": workers.critic}
        if self.cfg.trainer.sft_warmup_steps:
            roles["ref"] = workers.ref
        self.checkpointed = {role: worker for role, worker in roles.items() if worker is not None}
        self.start_step = 0
        self.restarts = distributed.restarts()  # torchrun restarts and SLURM requeues before this attempt
        self.cuda = run_ctx.device == "cuda"
        self.timeline = Timeline(self.cfg.trainer.output_dir, run_ctx.rank)
        self.profiler = StepProfiler(
            self.cfg.trainer.profile_steps, Path(self.cfg.trainer.output_dir), run_ctx.rank, cuda=self.cuda
        )
        self.mfu = actor_mfu(self.cfg, run_ctx.cluster.placement) if self.cuda else None
        self._finished = False

    @classmethod
    def build(cls, run_ctx: RunContext) -> "Trainer":
        """Collective: every rank builds its workers, engines, data partition, tracker and controller."""
        cfg, cluster, rank = run_ctx.cfg, run_ctx.cluster, run_ctx.rank
        pipeline = load_pipeline(cfg)
        out_dir = Path(cfg.trainer.output_dir)
        checkpointer = Checkpointer(cfg.checkpoint, out_dir, rank, run_ctx.world_size)
        tokenizer = load_tokenizer(cfg)
        workers = build_workers(run_ctx, pipeline, tokenizer)
        prompts = load_prompts(cfg, tokenizer, workers.rollout)
        ctx = NodeContext(
            cfg,
            cluster,
            rank,
            tokenizer,
            workers,
            weight_sync=WeightSync.for_run(cfg, cluster, rank, workers.actor, workers.rollout),
            prompt_loader=prompts.loader,  # dynamic sampling draws its extra rounds from the same order
        )
        tracker = Tracker(
            cfg.tracking,
            out_dir,
            rank=rank,
            config=dataclasses.asdict(cfg),
            total_steps=cfg.trainer.total_steps,
            **checkpointer.tracker_resume(),
        )
        coordinator = DataCoordinator(timeout_s=cfg.trainer.dist_timeout_s)
        failure = FailureSignal.from_default_group().start()
        controller = RankController(
            pipeline,
            ctx,
            rank,
            ranks_of_role(cluster),
            mover=CoordinatorMover(pipeline, cluster, coordinator),
            failure=failure,
        )
        run_ctx.log(
            f"pipeline {pipeline.name}: {' -> '.join(n.id for n in controller.order)}; "
            f"{len(prompts.train)} training prompts, {cfg.data.train_batch_size} x {cfg.rollout.n} samples per step"
        )
        if cfg.rollout.max_staleness:
            run_ctx.log(describe_staleness(cfg))
        return cls(run_ctx, ctx, controller, prompts, tracker, checkpointer, coordinator, failure)

    def resume_or_warm_up(self) -> None:
        """Step 1 starts from the resume checkpoint (checkpoint.resume), else from model.path after the
        optional supervised warm-up (trainer.sft_warmup_steps); either way the engines get those weights."""
        cfg, log, workers = self.cfg, self.run_ctx.log, self.ctx.workers
        self.start_step = self.checkpointer.restore(self.checkpointed, self.prompts.loader)
        self.rollouts.load_state_dict(self.checkpointer.rank_state.get("rollouts_ahead"))
        if sum(self.restarts.values()):
            log(
                f"this is a restarted attempt ({self.restarts['torchrun']} torchrun restart(s), "
                f"{self.restarts['slurm']} SLURM requeue(s) so far): it resumes from the last complete "
                "checkpoint, if any (trainer/restarts counts them)"
            )
        if self.start_step:  # the warm-up is part of what was restored
            self.ctx.weight_sync.continue_versions_from(self.checkpointer.meta["rollout_weight_version"] - 1)
            self.ctx.weight_sync.sync()  # becomes the checkpoint's version again
            log(f"resumed from {self.checkpointer.resume_from} after step {self.start_step}")
            if self.start_step >= cfg.trainer.total_steps:
                log(
                    f"nothing to train: the checkpoint is at step {self.start_step} and trainer.total_steps="
                    f"{cfg.trainer.total_steps}; raise trainer.total_steps to continue the run, or start a new one "
                    "with another trainer.output_dir (or checkpoint.resume=never)"
                )
        elif cfg.trainer.sft_warmup_steps:
            losses = []
            if workers.actor is not None:
                losses = sft_warmup(
                    workers.actor,
                    self.ctx.tokenizer,
                    self.prompts.train,
                    cfg.trainer.sft_warmup_steps,
                    cfg.data.train_batch_size,
                    cfg.trainer.seed,
                )
            self.ctx.weight_sync.sync()
            if workers.ref is not None:
                reference_from_actor(workers.actor, workers.ref)
            if losses:
                log(f"supervised warm-up: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    def train(self) -> None:
        """The RL loop: one DAG step, its metrics logged, a checkpoint every checkpoint.save_every steps."""
        total = self.cfg.trainer.total_steps
        for step in range(self.start_step + 1, total + 1):
            metrics = self.step(step)
            if self.prompts.val is not None and self._validates(step):
                val_metrics, val_rows = validate(self.ctx, self.prompts.val)
                metrics.update(val_metrics)
                self.tracker.log_samples(val_rows, step)
            self.tracker.log(metrics, step)
            if self.checkpointer.should_save(step, total):
                self.rollouts.settle()  # partial rollouts in flight: their samples go into the checkpoint
                self.checkpointer.save(
                    step,
                    self.checkpointed,
                    self.prompts.loader,
                    self.tracker.run_id,
                    rank_state={"rollouts_ahead": self.rollouts.state_dict()},
                    rollout_weight_version=self.ctx.workers.rollout.weight_version,
                )
        self._finished = True

    def step(self, step: int) -> dict[str, float]:
        """One RL step on this rank (collective): the pipeline's nodes in order, then the step's metrics,
        each reduced over the ranks by what it means (max, min, sum, weighted mean: tracking/reduce.py)."""
        start = time.perf_counter()
        self.ctx.step = StepState(step)  # sampling seeds are a function of (trainer.seed, step, sample)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()  # perf/max_memory_*: this step's peak
        with self.profiler.step(step):
            result = self.rollouts.step(step)
        self.timeline.write(step, result.spans)
        timing = {f"timing_s/{k}": v for k, v in result.timing_s.items()}
        metrics = reduce_over_ranks({**self.ctx.step.metrics, **timing, **memory_metrics(self.cuda)})
        step_s = time.perf_counter() - start
        metrics["timing_s/step"] = metrics["perf/time_per_step"] = step_s
        # rollout/tokens is the sum over all engines: tokens generated per second and GPU.
        metrics["perf/throughput"] = (
            metrics.get("rollout/tokens", 0.0) / step_s / self.run_ctx.cluster.placement.world_size
        )
        if self.mfu is not None:
            metrics.update(self.mfu.metrics(metrics))
        metrics["trainer/restarts"] = float(sum(self.restarts.values()))
        return metrics

    def _validates(self, step: int) -> bool:
        every = self.cfg.trainer.val_every
        return bool(every) and (step % every == 0 or step == 1)

    def export_hf(self) -> None:
        """checkpoint.export_hf: the final actor as Hugging Face safetensors in <output_dir>/hf (collective)."""
        if not self.cfg.checkpoint.export_hf:
            return
        state = self.ctx.workers.actor.export_hf_state() if self.ctx.workers.actor is not None else None
        if self.run_ctx.rank == 0:
            out = Path(self.cfg.trainer.output_dir) / "hf"
            save_hf_checkpoint(state, self.cfg.model.path, out)
            self.run_ctx.log(f"final actor exported to {out}")

    def close(self) -> None:
        """Ends what the run started, after an error too: the metrics files are closed (nothing logged is
        lost), the engines' processes and the reward workers stop. Only local work, so a rank whose
        peers are gone still gets out."""
        self.failure.stop()
        self.tracker.close()
        self.timeline.close()
        self.ctx.workers.rollout.close()
        if self.ctx.workers.reward_pool is not None:
            self.ctx.workers.reward_pool.close()
        if self._finished:  # after an error a transfer may still wait on a peer: leave its thread to the exit
            self.coordinator.close()


def describe_staleness(cfg) -> str:
    """What rollout.max_staleness = k does in this run's placement (the start-up log)."""
    k = cfg.rollout.max_staleness
    what = (
        f"rollout.max_staleness={k}: the engines generate the batches of the next {k} step(s) while this "
        f"step trains; every sample is at most {k} weight version(s) older than the policy that trains on it"
    )
    if cfg.rollout.partial:
        what += (
            "; partial rollouts: the weight sync interrupts the generation in flight and it continues under "
            "the new weights (rollout/partial_fraction: the share of tokens sampled before such a sync)"
        )
    if cfg.rollout.placement == "colocated":
        return what + (
            " (colocated placement: engines and trainer take turns on the same devices, so generation does not "
            "overlap training; rollout.placement=disaggregated gives the overlap)"
        )
    return what
