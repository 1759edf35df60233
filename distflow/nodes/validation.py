"""Validation: greedy answers to the held-out prompts on every engine, scored like the training samples.

Collective (one all_gather of the tallies); the trainer calls it on every rank every trainer.val_every steps.
The step's metrics are untouched: scoring here keeps its reward/* statistics to itself.
"""

import torch.distributed as dist

from distflow.data.loader import val_batches
from distflow.nodes.reward import score_samples
from distflow.tracking.validation import ValidationTally, validation_metrics


def validate(ctx, val_set) -> tuple[dict, list[dict]]:
    """The val/* metrics over all held-out prompts and per data_source (tracking/validation.py), and up to
    tracking.val_samples sample rows (prompt, response, ground truth, reward)."""
    cfg, tokenizer, rollout = ctx.cfg, ctx.tokenizer, ctx.workers.rollout
    max_rows = cfg.tracking.val_samples
    tally = ValidationTally(max_rows)
    if rollout.owner:
        for prompts in val_batches(
            val_set, cfg.data.val_batch_size, rollout.engine_index, rollout.num_engines
        ):
            if not prompts:
                continue
            samples = rollout.generate(prompts, tokenizer.eos_token_id, step=ctx.step.step, greedy=True)
            rewards = score_samples(ctx, samples)[0].fields["rewards"].tolist()
            starts, tokens = samples.offsets("input_ids").tolist(), samples.fields["input_ids"]
            for sample_id, start, reward in zip(samples.sample_ids.tolist(), starts, rewards):
                info = samples.infos[sample_id]
                if len(tally.rows) < max_rows:  # decode only the rows that are kept
                    prompt = tokenizer.decode(
                        tokens[start : start + info.prompt_len].tolist(), skip_special_tokens=True
                    )
                    response = tokenizer.decode(info.response_ids, skip_special_tokens=True)
                    tally.add(info.data_source, reward, prompt, response, info.ground_truth)
                else:
                    tally.add(info.data_source, reward)
    tallies = [None] * dist.get_world_size()
    dist.all_gather_object(tallies, tally)
    return validation_metrics(tallies, max_rows)
