"""generate: each engine owner samples rollout.n responses per prompt of its shard (with several engines
and rollout.balance=steal, idle engines take chunks of busy ones; the samples come back to their shard)."""

import time


def generate(ctx, inputs):
    samples, metrics = generate_samples(ctx, inputs["prompts"] or [])
    ctx.record(**metrics)
    return {"samples": samples}


def generate_samples(ctx, prompts) -> tuple:
    """(this rank's samples or None, their rollout/* metrics): the work of the generate node, for callers
    that generate more than once in a step (dynamic sampling) and keep the metrics they choose."""
    start = time.perf_counter()
    rollout = ctx.workers.rollout
    samples = rollout.generate(prompts, ctx.tokenizer.eos_token_id, step=ctx.step.step, balance=True)
    if samples is None:
        return None, {}
    infos = list(samples.infos.values())
    lengths = [len(i.response_ids) for i in infos]
    prompt_lengths = [i.prompt_len for i in infos]
    count, max_new = max(len(lengths), 1), ctx.cfg.rollout.max_new_tokens
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
    return samples, {k: float(v) for k, v in metrics.items()}


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
