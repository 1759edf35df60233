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
                      "rollout/tokens": samples.num_tokens, "rollout/weight_version": ctx.rollout.weight_version,
                      "rollout/seconds": time.perf_counter() - start})
    return {"samples": samples}
