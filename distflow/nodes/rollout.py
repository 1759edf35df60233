"""generate: each engine owner samples rollout.n responses per prompt of its shard."""
import time


def generate(ctx, inputs):
    start = time.perf_counter()
    samples = ctx.rollout.generate(inputs["prompts"] or [], ctx.tokenizer.eos_token_id)
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
    return {"samples": samples}
