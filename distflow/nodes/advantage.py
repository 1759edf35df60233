"""compute: outcome advantages per sample, with each prompt's group whole on this rank."""
import torch

from distflow.algorithms import advantages as adv
from distflow.coordination.data import PackedBatch


def compute(ctx, inputs):
    samples, rewards = inputs["samples"], inputs["rewards"]
    if samples is None:
        return {"advantages": None}
    assert torch.equal(samples.sample_ids, rewards.sample_ids), "rewards must come in the samples' order"
    r = rewards.fields["rewards"]
    ones = torch.ones(len(r), 1)  # one "token" per sample: outcome advantages are per sample
    a = ctx.cfg.algorithm
    if a.adv_estimator == "grpo":
        values = adv.grpo_advantages(r, samples.groups, ones, norm_adv_by_std=a.norm_adv_by_std)
    elif a.adv_estimator == "rloo":
        values = adv.rloo_advantages(r, samples.groups, ones)
    else:
        raise NotImplementedError(f"algorithm.adv_estimator={a.adv_estimator!r} is not wired into the trainer "
                                  "yet; use grpo or rloo")
    return {"advantages": PackedBatch(samples.sample_ids, samples.groups, samples.lengths,
                                      {"advantages": values[:, 0].float()})}
