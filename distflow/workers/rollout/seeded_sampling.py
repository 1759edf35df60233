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
"""
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor


class ReseedBeforeSampling(CustomLogitProcessor):
    """Re-seeds torch's default generator from the rows' `sampling_seed` custom params and positions."""

    def __call__(self, logits, custom_param_list=None):
        import torch

        mixed = 1469598103934665603  # FNV-1a over the rows' (seed, generated length) pairs, in batch order
        for params in custom_param_list or []:
            position = len(params["__req__"].output_ids)
            for value in (int(params["sampling_seed"]), position):
                mixed = ((mixed ^ (value & 0xFFFFFFFFFFFFFFFF)) * 1099511628211) % 2**64
        torch.manual_seed(mixed % 2**63)
        return logits


def processor_for(engine) -> str | None:
    """The serialized processor to attach to seeded requests of `engine`, or None where it is not needed
    (SGLang's own seeded sampler under enable_deterministic_inference) or not allowed (the engine was
    started without enable_custom_logit_processor: its samples then depend on its history)."""
    args = engine.server_args
    if getattr(args, "enable_deterministic_inference", False) or not getattr(args, "enable_custom_logit_processor",
                                                                             False):
        return None
    return ReseedBeforeSampling.to_str()
