"""generate: each engine owner samples rollout.n responses per prompt of its shard (with several engines
and rollout.balance=steal, idle engines take chunks of busy ones; the samples come back to their shard)."""
import time


def generate(ctx, inputs):
    start = time.perf_counter()
    samples = ctx.rollout.generate(inputs["prompts"] or [], ctx.tokenizer.eos_token_id, balance=True)
    if samples is not None:
        infos = ctx.rollout.infos.values()
        lengths = [len(i.response_ids) for i in infos]
        max_new = ctx.cfg.rollout.max_new_tokens
        ctx.record(**{"rollout/response_length/mean": sum(lengths) / max(len(lengths), 1),
                      "rollout/response_length/max": max(lengths, default=0),
                      "rollout/response_length/min": min(lengths, default=0),
                      "rollout/response_length/clip_ratio": sum(l >= max_new for l in lengths) / max(len(lengths), 1),
                      "rollout/tokens": samples.num_tokens,
                      # the oldest weights behind any sample (all equal on-policy)
                      "rollout/weight_version": min((i.weight_version for i in infos),
                                                    default=ctx.rollout.weight_version),
                      "rollout/seconds": time.perf_counter() - start})
        stats = ctx.rollout.balance_stats
        if stats is not None:  # several engines: the same totals over all engines on every owner
            per_engine = stats["engine_tokens"]
            mean = sum(per_engine) / len(per_engine)
            ctx.record(**{"rollout/stolen_groups": stats["stolen_groups"],
                          "rollout/engine_tokens_max_over_mean": max(per_engine) / mean if mean else 1.0})
    return {"samples": samples}
