"""Sampling that depends on (request seeds, positions) only, on engines that cannot honour `sampling_seed`.

Why: SGLang 0.5.23 applies a request's `sampling_seed` only under `enable_deterministic_inference`, whose
seeded sampler is a Triton kernel and whose attention backends are GPU ones; on CPU (and on GPU engines
started without that option) every token is drawn from the scheduler's global torch generator, so the
samples of a call depend on every call the engine has served before. A resumed run starts a fresh engine,
so its samples would differ from those of the run that never stopped.

`ReseedBeforeSampling` is an SGLang custom logit processor (its public extension point, enabled with the
`enable_custom_logit_processor` server argument). It runs in the scheduler right before each batch is
sampled, leaves the logits untouched (so rollout log-probs are unchanged) and re-seeds the scheduler's
generator from the batch's (sampling_seed, position) pairs. A batch's draws then depend only on its
requests' seeds and positions, in batch order, not on engine history. Batch order is fixed because all of a
call's requests are submitted together (see sglang_engine.generate).

"Position" is the index of the token being sampled, which `len(req.output_ids)` is not: with SGLang's
overlap scheduler (the default) a request's output_ids lag one step behind the batch, so the prefill and the
first decode step both read 0, the generator got the same seed for tokens 0 and 1, and token 1 was drawn with
token 0's random numbers (it repeated token 0 far more often than the policy says, and the whole response
was sharper than the policy: two engines' small batches trained to half the entropy of one engine's). The
position is counted instead from the request's decode steps since its last (re)prefill, on top of the
tokens it already had then (a retracted request is prefilled again with its output so far).
"""

import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor


class ReseedBeforeSampling(CustomLogitProcessor):
    """Re-seeds torch's default generator from the rows' `sampling_seed` custom params and positions."""

    def __call__(self, logits, custom_param_list=None):
        mixed = 1469598103934665603  # FNV-1a over the rows' (seed, position) pairs, in batch order
        for params in custom_param_list or []:
            position = sampled_position(params)
            for value in (int(params["sampling_seed"]), position):
                mixed = ((mixed ^ (value & 0xFFFFFFFFFFFFFFFF)) * 1099511628211) % 2**64
        torch.manual_seed(mixed % 2**63)
        return logits


def sampled_position(params: dict) -> int:
    """The index in the response of the token about to be sampled for the request whose custom params (with
    SGLang's `__req__`) are `params`. SGLang resets `decode_batch_idx` to 0 at each (re)prefill and adds one
    per decode step before the forward; `params` is the request's own dict, so it can hold the count of
    tokens the request had at its last prefill."""
    req = params["__req__"]
    steps = getattr(req, "decode_batch_idx", None)
    if steps is None:  # an SGLang without the counter: its output_ids are the best we have
        return len(req.output_ids)
    if steps == 0:
        params["_distflow_prefill_tokens"] = len(req.output_ids)
    return params.get("_distflow_prefill_tokens", 0) + steps


def processor_for(engine) -> str | None:
    """The serialized processor to attach to seeded requests of `engine`, or None where it is not needed
    (SGLang's own seeded sampler under enable_deterministic_inference) or not allowed (the engine was
    started without enable_custom_logit_processor: its samples then depend on its history)."""
    args = engine.server_args
    if getattr(args, "enable_deterministic_inference", False) or not getattr(
        args, "enable_custom_logit_processor", False
    ):
        return None
    return ReseedBeforeSampling.to_str()
