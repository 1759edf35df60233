"""The RL trainer every rank runs: build the workers, then walk the DAG once per step.

No rank drives the others: each builds its own share (its Megatron shard, the engine it owns, its data
partition), runs the same DAG with its own controller, and the only cross-rank traffic is data moving
between layouts, the weight sync and one small all-gather of metrics per step for logging.
"""
import time
from pathlib import Path

import torch
import torch.distributed as dist

from distflow.tracking.perf import memory_metrics
from distflow.tracking.profiling import StepProfiler
from distflow.tracking.reduce import reduce_over_ranks
from distflow.tracking.validation import ValidationTally, validation_metrics


def run(ctx) -> None:
    from transformers import AutoTokenizer

    from distflow.checkpointing import Checkpointer
    from distflow.coordination.data import DataCoordinator
    from distflow.dag.controller import RankController
    from distflow.dag.data_mover import CoordinatorMover
    from distflow.dag.failure import FailureSignal
    from distflow.dag.loading import load_pipeline
    from distflow.dag.roles import ranks_of_role
    from distflow.data.loader import PromptLoader
    from distflow.data.prompts import PromptDataset
    from distflow.nodes.context import NodeContext
    from distflow.rewards.pool import RewardPool
    from distflow.tracking.tracker import Tracker
    from distflow.workers.megatron.worker import MegatronWorker
    from distflow.workers.rollout.worker import RolloutWorker

    cfg, cluster, placement = ctx.cfg, ctx.cluster, ctx.cluster.placement
    pipeline = load_pipeline(cfg)
    out_dir = Path(cfg.trainer.output_dir)
    checkpointer = Checkpointer(cfg.checkpoint, out_dir, ctx.rank, ctx.world_size)  # checks checkpoint.resume
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)
    n = cfg.rollout.n
    mini = cfg.actor.mini_batch_size or cfg.data.train_batch_size
    updates_per_step = cfg.actor.ppo_epochs * (cfg.data.train_batch_size // mini)
    actor_cfg = _with_mini_batch(cfg.actor, mini)
    node_ctx = NodeContext(cfg, cluster, ctx.rank, tokenizer)
    if ctx.trains:  # disaggregated placement: the rollout-only ranks build no Megatron worker
        node_ctx.actor = MegatronWorker("actor", actor_cfg, cfg.model, cluster.actor, ctx.device,
                                        samples_per_prompt=n,
                                        total_optimizer_steps=cfg.trainer.total_steps * updates_per_step,
                                        seed=cfg.trainer.seed)
        if cluster.ref is not None:
            node_ctx.ref = MegatronWorker("ref", cfg.ref, cfg.model, cluster.ref, ctx.device)
        if cluster.reward_model is not None:
            from distflow.nodes.reward_model_setup import build_reward_model

            node_ctx.reward_model = build_reward_model(cfg, cluster.reward_model, tokenizer, ctx.device)
        if any(node.role == "critic" for node in pipeline.nodes):
            node_ctx.critic = _build_critic(cfg, cluster, ctx.device)
    if ctx.trains:
        ctx.log("Megatron workers built: " + ", ".join(
            role for role in ("actor", "ref", "critic", "reward_model") if getattr(node_ctx, role) is not None))
    node_ctx.rollout = RolloutWorker(cfg, placement, ctx.rank, cfg.model.path)
    ctx.log(f"{placement.num_engines} SGLang engine(s) up")
    train_set = PromptDataset.from_config(cfg.data, tokenizer, "train")
    val_set = PromptDataset.from_config(cfg.data, tokenizer, "val") if cfg.data.val_files else None
    loader = None
    if node_ctx.rollout.owner:
        node_ctx.reward_pool = RewardPool.from_config(cfg.reward)
        loader = PromptLoader.from_config(cfg.data, train_set, node_ctx.rollout.engine_index, placement.num_engines)
    node_ctx.prompt_loader = loader  # dynamic sampling draws its extra rounds from the same data order
    tracker = Tracker(cfg.tracking, out_dir, rank=ctx.rank, config=_as_dict(cfg),
                      total_steps=cfg.trainer.total_steps, **checkpointer.tracker_resume())
    trainable = {role: w for role, w in (("actor", node_ctx.actor), ("critic", node_ctx.critic)) if w is not None}
    for worker in trainable.values():
        worker.max_consecutive_bad_steps = cfg.trainer.max_consecutive_bad_steps
    coordinator = DataCoordinator(timeout_s=cfg.trainer.dist_timeout_s)
    failure = FailureSignal.from_default_group().start()
    controller = RankController(pipeline, node_ctx, ctx.rank, ranks_of_role(cluster),
                                mover=CoordinatorMover(pipeline, cluster, coordinator), failure=failure)
    ctx.log(f"pipeline {pipeline.name}: {' -> '.join(n.id for n in controller.order)}; "
            f"{len(train_set)} training prompts, {cfg.data.train_batch_size} x {n} samples per step")

    checkpointed = dict(trainable)
    if node_ctx.ref is not None and cfg.trainer.sft_warmup_steps:
        checkpointed["ref"] = node_ctx.ref  # the warmed-up actor's copy (see below): model.path does not hold it
    start_step = checkpointer.restore(checkpointed, loader)
    if start_step:  # the engines get the restored actor; the warm-up is part of what was restored
        from distflow.nodes.sync import sync_weights

        node_ctx.rollout.continue_versions_from(checkpointer.meta["rollout_weight_version"] - 1)
        sync_weights(node_ctx, {})  # becomes the checkpoint's version again
        ctx.log(f"resumed from {checkpointer.resume_from} after step {start_step}")
        if start_step >= cfg.trainer.total_steps:
            ctx.log(f"nothing to train: the checkpoint is at step {start_step} and trainer.total_steps="
                    f"{cfg.trainer.total_steps}; raise trainer.total_steps to continue the run, or start a new one "
                    "with another trainer.output_dir (or checkpoint.resume=never)")
    elif cfg.trainer.sft_warmup_steps:
        from distflow.nodes.sync import sync_weights
        from distflow.nodes.warmup import reference_from_actor, sft_warmup

        losses = sft_warmup(node_ctx, train_set, cfg.trainer.sft_warmup_steps, cfg.data.train_batch_size,
                            cfg.trainer.seed) if ctx.trains else []
        sync_weights(node_ctx, {})
        if node_ctx.ref is not None:
            reference_from_actor(node_ctx)
        if losses:
            ctx.log(f"supervised warm-up: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    cuda = ctx.device == "cuda"
    profiler = StepProfiler(cfg.trainer.profile_steps, out_dir, ctx.rank, cuda=cuda)
    actor_mfu = _actor_mfu(cfg, placement) if cuda else None
    for step in range(start_step + 1, cfg.trainer.total_steps + 1):
        start = time.perf_counter()
        node_ctx.metrics = {}
        node_ctx.rollout.step = step  # sampling seeds are a function of (trainer.seed, step, sample)
        if cuda:
            torch.cuda.reset_peak_memory_stats()  # perf/max_memory_*: this step's peak
        with profiler.step(step):
            result = controller.run_step({"prompts": next(loader) if loader else None})
        metrics = {f"timing_s/{k}": v for k, v in result.timing_s.items()}
        # Each metric reduced over the ranks by what it means (max, min, sum, weighted mean: tracking/reduce.py).
        metrics.update(reduce_over_ranks({**node_ctx.metrics, **memory_metrics(cuda)}))
        step_s = time.perf_counter() - start
        metrics["timing_s/step"] = metrics["perf/time_per_step"] = step_s
        # rollout/tokens is the sum over all engines: tokens generated per second and GPU.
        metrics["perf/throughput"] = metrics.get("rollout/tokens", 0.0) / step_s / placement.world_size
        if actor_mfu is not None:
            metrics.update(actor_mfu.metrics(metrics))
        if val_set is not None and cfg.trainer.val_every and (step % cfg.trainer.val_every == 0 or step == 1):
            val_metrics, val_rows = _validate(node_ctx, val_set, cfg, placement)
            metrics.update(val_metrics)
            tracker.log_samples(val_rows, step)
        tracker.log(metrics, step)
        if checkpointer.should_save(step, cfg.trainer.total_steps):
            checkpointer.save(step, checkpointed, loader, tracker.run_id,
                              rollout_weight_version=node_ctx.rollout.weight_version)
    tracker.close()
    failure.stop()
    state = node_ctx.actor.export_hf_state() if ctx.trains else None
    if ctx.rank == 0 and cfg.checkpoint.export_hf:
        from distflow.workers.megatron.hf_io import save_hf_checkpoint

        save_hf_checkpoint(state, cfg.model.path, out_dir / "hf")
        ctx.log(f"final actor exported to {out_dir / 'hf'}")
    node_ctx.rollout.close()
    if node_ctx.reward_pool is not None:
        node_ctx.reward_pool.close()
    coordinator.close()


def _validate(node_ctx, val_set, cfg, placement) -> tuple[dict, list[dict]]:
    """Greedy answers to the held-out prompts on every engine (collective): the val/* metrics over all of
    them and per data_source (tracking/validation.py), and up to tracking.val_samples sample rows."""
    from distflow.data.loader import val_batches
    from distflow.nodes.reward import score

    tokenizer, max_rows = node_ctx.tokenizer, cfg.tracking.val_samples
    tally = ValidationTally(max_rows)
    if node_ctx.rollout.owner:
        for prompts in val_batches(val_set, cfg.data.val_batch_size, node_ctx.rollout.engine_index,
                                   placement.num_engines):
            if not prompts:
                continue
            samples = node_ctx.rollout.generate(prompts, tokenizer.eos_token_id, greedy=True)
            saved = dict(node_ctx.metrics)  # the score node records training stats: keep the step's
            rewards = score(node_ctx, {"samples": samples})["rewards"].fields["rewards"].tolist()
            node_ctx.metrics = saved
            starts, tokens = samples.offsets("input_ids").tolist(), samples.fields["input_ids"]
            for sample_id, start, reward in zip(samples.sample_ids.tolist(), starts, rewards):
                info = node_ctx.rollout.infos[sample_id]
                if len(tally.rows) < max_rows:  # decode only the rows that are kept
                    prompt = tokenizer.decode(tokens[start:start + info.prompt_len].tolist(), skip_special_tokens=True)
                    response = tokenizer.decode(info.response_ids, skip_special_tokens=True)
                    tally.add(info.data_source, reward, prompt, response, info.ground_truth)
                else:
                    tally.add(info.data_source, reward)
    tallies = [None] * dist.get_world_size()
    dist.all_gather_object(tallies, tally)
    return validation_metrics(tallies, max_rows)


def _actor_mfu(cfg, placement):
    """perf/mfu/actor's calculator on a GPU whose peak is known, else None (the metric is then absent)."""
    from distflow.plan.model_size import ModelArch
    from distflow.tracking.perf import ActorMFU, peak_flops

    peak = peak_flops(torch.cuda.get_device_name())
    if peak is None:
        return None
    return ActorMFU(ModelArch.from_json(cfg.model.path), peak, len(placement.train_ranks), cfg.actor.ppo_epochs)


def _build_critic(cfg, cluster, device: str):
    """The critic: a MegatronWorker with a value head, trained with its own optimizer (cfg.critic)."""
    from distflow.config import ConfigError
    from distflow.workers.megatron.worker import MegatronWorker

    if cluster.critic is None:
        raise ConfigError("the pipeline has critic nodes but there is no critic: set critic.enable=true")
    if cluster.critic != cluster.actor:
        # Megatron-Core keeps one set of process groups per process, built for the actor's layout.
        raise ConfigError(f"critic layout {cluster.critic.describe()} differs from the actor's "
                          f"{cluster.actor.describe()}; give the critic the actor's parallel sizes "
                          "(critic.tp/pp/vpp/cp/ep/etp = actor's)")
    mini = cfg.critic.mini_batch_size or cfg.data.train_batch_size
    updates_per_step = cfg.critic.ppo_epochs * (cfg.data.train_batch_size // mini)
    return MegatronWorker("critic", _with_mini_batch(cfg.critic, mini), cfg.model, cluster.critic, device,
                          samples_per_prompt=cfg.rollout.n,
                          total_optimizer_steps=cfg.trainer.total_steps * updates_per_step, seed=cfg.trainer.seed)


def _with_mini_batch(actor_cfg, mini: int):
    import dataclasses

    return dataclasses.replace(actor_cfg, mini_batch_size=mini)


def _as_dict(cfg) -> dict:
    import dataclasses

    return dataclasses.asdict(cfg)
