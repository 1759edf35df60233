"""generate: each engine owner samples rollout.n responses per prompt of its shard (with several engines
and rollout.balance=steal, idle engines take chunks of busy ones; the samples come back to their shard).
With reward.stream, each prompt group goes to the reward pool as soon as its last response finishes, so the
scorers work while the engine generates the rest; the score node then collects those rewards. With
rollout.stream_chunks, the finished samples also leave for the training layout in parts (dag/streaming.py)."""

import contextlib
import time

import torch.distributed as dist

from distflow.dag.controller import RolloutLost
from distflow.nodes.reward import reward_sample
from distflow.workers.rollout import engine_health
from distflow.workers.rollout.engine_health import EngineDiedError
from distflow.workers.rollout.work_stealing import EveryEngineDied


def generate(ctx, inputs):
    samples, metrics = generate_samples(ctx, inputs["prompts"] or [])
    ctx.record(**metrics)
    return {"samples": samples}


def generate_samples(ctx, prompts) -> tuple:
    """(this rank's samples or None, their rollout/* metrics): the work of the generate node, for callers
    that generate more than once in a step (dynamic sampling) and keep the metrics they choose.
    An engine that dies with the rollout's requests and no live engine to take them (a single engine, or
    every engine of the step) is restarted within rollout.engine_restarts:
    - where every rank owns an engine (regenerates_in_place): every rank syncs the actor's current weights
      into the engines again under the same version, and each dead engine's owner generates its prompts
      again with the same seeds: the step's samples are the ones it would have had;
    - otherwise (regenerates_on_take: the training-only ranks are elsewhere, maybe training): the engine's
      ranks raise RolloutLost, and the step that takes the rollout generates it again (dag/lookahead.py).
    - with DAPO's dynamic sampling and training-only ranks (regenerates_in_rounds), the round is marked
      lost (ctx.step.lost_prompts; no samples), and the dynamic-sampling loop, where every rank is,
      resyncs and generates it again.
    Either way no job restart is needed."""
    if regenerates_in_rounds(ctx.cfg, ctx.cluster.placement):
        return _generate_or_mark_lost(ctx, prompts)
    if regenerates_on_take(ctx.cfg, ctx.cluster.placement):
        return _generate_or_lose(ctx, prompts)
    if not regenerates_in_place(ctx):
        return _generate(ctx, prompts, balance=True)
    rollout, result, balance = ctx.workers.rollout, None, True
    while True:
        died = None
        if result is None:
            try:
                result = _generate(ctx, prompts, balance)
            except (EngineDiedError, EveryEngineDied) as exc:
                died = exc
        deaths = _gathered(None if died is None else str(died).splitlines()[0])
        if not any(deaths):
            return result
        # Every rank: all restart and sync again, or all raise (a dead engine whose restarts are spent).
        refused = ctx.weight_sync.restart_refusals()
        if refused:
            first = next(d for d in deaths if d)
            raise EngineDiedError(f"{died or first}; not restarted in place: {refused}") from died
        if rollout.owner and engine_health.is_dead(rollout.engine):
            cause = f"died in step {ctx.step.step}'s rollout; its prompts are generated again"
            if rollout.restarts.at_syncs:
                print(
                    f"[rollout] engine {rollout.engine_index} {cause} after the resync restarts it",
                    flush=True,
                )
            else:
                rollout.restarts.restart_engine(cause)
        ctx.weight_sync.resync()  # restarts an engine over nodes, with its other nodes' ranks
        # Each dead owner generates its own prompts alone (with their home seeds, the same samples).
        balance, rollout.balance_stats = False, None


def regenerates_in_place(ctx) -> bool:
    """Whether a rollout whose engines died can be generated again in place (generate_samples): engine
    restarts allowed (rollout.engine_restarts), every rank an engine owner's (colocated: all take part in
    the weight sync the restarted engine needs) and the samples leaving whole. Any
    rollout.max_staleness: colocated ranks generate before they train a step, so the actor has not moved
    since the sync that made the rollout's weights, and syncing again gives them back.
    Otherwise (and not regenerates_on_take) such a death stops the job, and a torchrun restart resumes it
    from its last checkpoint."""
    r = ctx.cfg.rollout
    if not (r.engine_restarts > 0 and ctx.samples_stream is None):
        return False
    return _every_rank_owns_an_engine(ctx.cluster.placement)


def regenerates_on_take(cfg, placement) -> bool:
    """Whether a rollout whose engines died is generated again by the step that takes it (RolloutLost,
    dag/lookahead.py): engine restarts allowed, some ranks without an engine (disaggregated: the training
    ranks may be training while the engines generate ahead, so nothing collective can happen mid-rollout)
    and no dynamic sampling (its collective is mid-rollout). A partial rollout's requests continue on the
    restarted engine from what they had sampled. A streamed rollout (rollout.stream_chunks) sends its
    remaining parts at once, and the training ranks drop the log-probs they computed on the parts
    (dag/lookahead.py). Every rank decides alike."""
    r = cfg.rollout
    return (
        r.engine_restarts > 0
        and not cfg.algorithm.dynamic_sampling
        and not _every_rank_owns_an_engine(placement)
    )


def regenerates_in_rounds(cfg, placement) -> bool:
    """Whether a generation round whose engines died is generated again by the dynamic-sampling loop
    (nodes/dynamic_sampling.py): engine restarts allowed, DAPO's dynamic sampling (lock-step: every rank,
    training-only ones too, is in the loop's collective while the engines generate) and some ranks without
    an engine (where every rank owns one, regenerates_in_place does it within the generation)."""
    r = cfg.rollout
    return (
        r.engine_restarts > 0 and cfg.algorithm.dynamic_sampling and not _every_rank_owns_an_engine(placement)
    )


def _every_rank_owns_an_engine(placement) -> bool:
    return len(placement.rollout_ranks) == placement.world_size


def _generate_or_lose(ctx, prompts) -> tuple:
    """_generate; when the engine dies with no live engine to take its prompts, restarts it (within
    rollout.engine_restarts, else the death stops the job) and raises RolloutLost."""
    try:
        return _generate(ctx, prompts, balance=True)
    except (EngineDiedError, EveryEngineDied) as exc:
        rollout = ctx.workers.rollout
        rollout.restarts.raise_unless_restartable(exc)
        stream = ctx.samples_stream
        if stream is not None and not stream.closed:  # every rank walks all of its parts: the rest leave now
            stream.close()
        # EveryEngineDied: restarted already. An engine over nodes restarts in the resync of the step that
        # takes the rollout, with its other nodes' ranks (EngineRestarts.revive_dead_engines).
        if rollout.owner and engine_health.is_dead(rollout.engine) and not rollout.restarts.at_syncs:
            rollout.restarts.restart_engine(
                f"died in step {ctx.step.step}'s rollout; it is generated again when that step takes it"
            )
        raise RolloutLost(f"engine {rollout.engine_index}: {str(exc).splitlines()[0]}") from exc


def _generate_or_mark_lost(ctx, prompts) -> tuple:
    """_generate; when the engine dies with no live engine to take its prompts, restarts it (within
    rollout.engine_restarts, else the death stops the job; an engine over nodes restarts in the resync)
    and returns no samples, the prompts kept in ctx.step.lost_prompts for the round to be drawn again."""
    try:
        return _generate(ctx, prompts, balance=True)
    except (EngineDiedError, EveryEngineDied) as exc:
        rollout = ctx.workers.rollout
        rollout.restarts.raise_unless_restartable(exc)
        cause = f"died in step {ctx.step.step}'s rollout; its prompts are generated again after a resync"
        if rollout.owner and engine_health.is_dead(rollout.engine):
            if rollout.restarts.at_syncs:
                print(f"[rollout] engine {rollout.engine_index} {cause}, which restarts it", flush=True)
            else:
                rollout.restarts.restart_engine(cause)
        ctx.step.lost_prompts = prompts
        return None, {}


def _gathered(value) -> list:
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _generate(ctx, prompts, balance: bool) -> tuple:
    start = time.perf_counter()
    rollout, pool = ctx.workers.rollout, ctx.workers.reward_pool
    scores = pool is not None and rollout.owner and streams_rewards(ctx.cfg)
    # rollout.stream_chunks: the samples also leave for the trainer in parts (the step's first call only).
    stream = ctx.samples_stream if ctx.samples_stream is not None and rollout.owner else None
    if stream is not None and stream.closed:
        stream = None
    if not (scores or stream):
        samples = rollout.generate(prompts, ctx.tokenizer.eos_token_id, step=ctx.step.step, balance=balance)
        return samples, _metrics(ctx, samples, start)

    def on_group(group, prompt):
        infos = [group.infos[i] for i in group.sample_ids.tolist()]
        scored = [
            reward_sample(ctx.tokenizer, i.response_ids[i.final_turn :], i.finish_reason, prompt)
            for i in infos
        ]
        pool.submit(group.sample_ids.tolist(), scored)

    if stream is not None:  # the log-prob passes need samples, not groups: each leaves as it finishes
        stream.expect(len(prompts) * ctx.cfg.rollout.n)
    with pool.streaming() if scores else contextlib.nullcontext():
        samples = rollout.generate(
            prompts,
            ctx.tokenizer.eos_token_id,
            step=ctx.step.step,
            balance=balance,
            on_group=on_group if scores else None,
            on_sample=None if stream is None else stream.add,
        )
        if stream is not None:
            stream.close()  # the parts of groups not streamed (another engine generated them) leave now
        metrics = _metrics(ctx, samples, start)
        if scores:  # how much of the scoring the generation hid (the score node waits for the rest)
            metrics["perf/scored_during_generation"] = pool.scored(samples.sample_ids.tolist()) / max(
                len(samples), 1
            )
    return samples, metrics


def _metrics(ctx, samples, start: float) -> dict[str, float]:
    """The rollout/* metrics of this rank's samples (none on ranks without an engine)."""
    if samples is None:
        return {}
    rollout = ctx.workers.rollout
    infos = list(samples.infos.values())
    lengths = [len(i.response_ids) for i in infos]
    prompt_lengths = [i.prompt_len for i in infos]
    r = ctx.cfg.rollout
    count = max(len(lengths), 1)
    # a response's bound: a multi-turn trajectory's is the whole trajectory's
    max_new = r.max_new_tokens if r.env is None else (r.max_total_tokens or r.max_new_tokens * r.max_turns)
    # Means over this engine's samples, weighted by rollout/samples over the engines (tracking/reduce.py).
    metrics = {
        "rollout/samples": len(lengths),
        "rollout/response_length/mean": sum(lengths) / count,
        "rollout/response_length/max": max(lengths, default=0),
        "rollout/response_length/min": min(lengths, default=0),
        "rollout/response_length/clip_ratio": sum(length >= max_new for length in lengths) / count,
        "rollout/prompt_length/mean": sum(prompt_lengths) / count,
        "rollout/prompt_length/max": max(prompt_lengths, default=0),
        "rollout/prompt_length/min": min(prompt_lengths, default=0),
        "rollout/tokens": samples.num_tokens,
        # the oldest weights behind any sample (all equal on-policy)
        "rollout/weight_version": min((i.weight_version for i in infos), default=rollout.weight_version),
        "rollout/seconds": time.perf_counter() - start,
    }
    if ctx.cfg.rollout.partial:
        metrics["rollout/partial_fraction"] = partial_fraction(infos)
    records = [i.env for i in infos if i.env is not None]
    if records:  # multi-turn (rollout.env)
        metrics.update(trajectory_metrics(records, lengths))
    stats = rollout.balance_stats
    if stats is not None:  # several engines: the same totals over all engines on every owner
        per_engine = stats["engine_tokens"]
        mean = sum(per_engine) / len(per_engine)
        metrics.update(
            {
                "rollout/stolen_groups": stats["stolen_groups"],
                "rollout/engine_tokens_max_over_mean": max(per_engine) / mean if mean else 1.0,
            }
        )
    return {k: float(v) for k, v in metrics.items()}


def trajectory_metrics(records: list[dict], lengths: list[int]) -> dict[str, float]:
    """Multi-turn rollouts' metrics over one engine's trajectories (their RolloutSample.env records)."""
    count = len(records)
    mean_length = sum(lengths) / max(len(lengths), 1)
    return {
        "rollout/turns_mean": sum(r["turns"] for r in records) / count,
        "rollout/tool_calls_mean": sum(r["tool_calls"] for r in records) / count,
        "rollout/tool_errors": sum(r["tool_errors"] for r in records),
        "rollout/env_timeouts": sum(r["status"] == "env_timeout" for r in records),
        "rollout/env_errors": sum(r["status"] == "env_error" for r in records),
        "rollout/trajectory_tokens_max_over_mean": max(lengths, default=0) / mean_length
        if mean_length
        else 1.0,
    }


def streams_rewards(cfg) -> bool:
    """Whether the training rollout's groups are scored as they finish (reward.stream): with the pool's
    rule-based or custom rewards, and not for a rollout submitted ahead (rollout.partial), whose requests
    finish while the rank does other work."""
    return cfg.reward.stream and cfg.reward.model_path is None and not cfg.rollout.partial


def partial_fraction(infos) -> float:
    """The share of response tokens sampled under an older weight version than their sample's last tokens:
    those generated before a weight sync that interrupted their sample (partial rollouts)."""
    older = total = 0
    for info in infos:
        versions = info.token_versions or []
        total += len(info.response_ids)
        if versions:
            older += sum(v < versions[-1] for v in versions)
    return older / total if total else 0.0
