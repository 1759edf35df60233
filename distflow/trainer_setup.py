"""What a rank builds before step 1: its workers (Megatron shards, its engine), its data, its MFU meter.

Every rank builds its own share: a Megatron worker per role it trains (actor, and the reference, critic and
reward model the config asks for), the RolloutWorker (the SGLang engine it owns or hosts, or none), and on
engine owners the reward scorers and its partition of the prompts.
"""

import dataclasses
from dataclasses import dataclass

import torch
from transformers import AutoTokenizer

from distflow.data.loader import PromptLoader
from distflow.data.prompts import PromptDataset
from distflow.nodes.context import Workers
from distflow.nodes.reward_model_setup import build_reward_model
from distflow.nodes.sync import WeightSync
from distflow.plan.model_size import ModelArch  # entry-level tool code: only on GPUs
from distflow.rewards.pool import RewardPool
from distflow.run_context import RunContext
from distflow.tracking.perf import ActorMFU, peak_flops
from distflow.workers.megatron.worker import MegatronWorker
from distflow.workers.rollout import multi_turn
from distflow.workers.rollout.worker import RolloutWorker


def load_tokenizer(cfg):
    return AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)


def build_workers(run: RunContext, pipeline, tokenizer) -> Workers:
    """This rank's workers. The rollout-only ranks of a disaggregated placement build no Megatron worker."""
    cfg, cluster = run.cfg, run.cluster
    workers = Workers()
    if run.trains:
        workers.actor = _trained_worker("actor", cfg.actor, cfg, cluster.actor, run.device)
        if cluster.ref is not None:
            workers.ref = MegatronWorker("ref", cfg.ref, cfg.model, cluster.ref, run.device)
        if cluster.reward_model is not None:
            workers.reward_model = build_reward_model(cfg, cluster.reward_model, tokenizer, run.device)
        if any(node.role == "critic" for node in pipeline.nodes):
            workers.critic = _trained_worker("critic", cfg.critic, cfg, cluster.critic, run.device)
        run.log("Megatron workers built: " + ", ".join(workers.built()))
        for worker in (workers.actor, workers.critic):
            if worker is not None:
                worker.max_consecutive_bad_steps = cfg.trainer.max_consecutive_bad_steps
    workers.rollout = RolloutWorker(
        cfg,
        cluster.placement,
        run.rank,
        cfg.model.path,
        weight_loaders=WeightSync.engine_loaders(),
        trajectories=multi_turn.runner_for(cfg, tokenizer),
    )
    run.log(
        f"{cluster.placement.num_engines} SGLang engine(s) up"
        + (
            ", returning their MoE routes for the actor's routing replay"
            if cfg.actor.moe_routing_replay
            else ""
        )
    )
    if workers.rollout.owner:
        workers.reward_pool = RewardPool.from_config(cfg.reward)
    return workers


def _trained_worker(role: str, role_cfg, cfg, layout, device: str) -> MegatronWorker:
    """The actor or the critic: a MegatronWorker with its optimizer, its LR schedule over the whole run.
    (Critic nodes without critic.enable, or a critic layout unlike the actor's, were refused by the
    pre-flight and the cluster layout, before any process group.)"""
    mini = role_cfg.mini_batch_size or cfg.data.train_batch_size
    updates_per_step = role_cfg.ppo_epochs * (cfg.data.train_batch_size // mini)
    return MegatronWorker(
        role,
        dataclasses.replace(role_cfg, mini_batch_size=mini),
        cfg.model,
        layout,
        device,
        samples_per_prompt=cfg.rollout.n,
        total_optimizer_steps=cfg.trainer.total_steps * updates_per_step,
        seed=cfg.trainer.seed,
    )


@dataclass
class Prompts:
    """The run's prompts as this rank sees them."""

    train: PromptDataset
    val: PromptDataset | None
    """data.val_files, or None (no validation)."""
    loader: PromptLoader | None
    """This rank's partition of `train`, in the run's order; None on ranks without an engine."""


def load_prompts(cfg, tokenizer, rollout: RolloutWorker) -> Prompts:
    train = PromptDataset.from_config(cfg.data, tokenizer, "train")
    val = PromptDataset.from_config(cfg.data, tokenizer, "val") if cfg.data.val_files else None
    loader = None
    if rollout.owner:
        loader = PromptLoader.from_config(cfg.data, train, rollout.engine_index, rollout.num_engines)
    return Prompts(train, val, loader)


def actor_mfu(cfg, placement):
    """perf/mfu/actor's calculator on a GPU whose peak is known, else None (the metric is then absent).
    Call it on a training device that is a GPU."""
    peak = peak_flops(torch.cuda.get_device_name())
    if peak is None:
        return None
    return ActorMFU(
        ModelArch.from_json(cfg.model.path), peak, len(placement.train_ranks), cfg.actor.ppo_epochs
    )
