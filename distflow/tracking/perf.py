"""perf/* metrics that need the hardware: model FLOPs utilisation (GPU) and memory (GPU and CPU).

perf/mfu/actor = training FLOPs of the step's tokens / (update time x peak FLOP/s x actor GPUs), the FLOPs
being 6 per matmul parameter per token (forward + backward) plus the attention scores' 12 x layers x width x
sequence length (the count verl and Megatron use), times actor.ppo_epochs. The peak is the GPU's dense bf16
peak (PEAK_BF16_TFLOPS); on an unknown GPU or on CPU there is no MFU.
"""

import psutil
import torch

# Dense bf16 peak TFLOP/s by device-name fragment (first match wins: H200 before H20, L40S before L40).
PEAK_BF16_TFLOPS = (
    ("B200", 2250.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("H20", 148.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("A10", 125.0),
    ("4090", 165.0),
)
GIB = 2**30


def peak_flops(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s of the GPU called `device_name` (torch.cuda.get_device_name), None if unknown."""
    for fragment, tflops in PEAK_BF16_TFLOPS:
        if fragment in device_name:
            return tflops * 1e12
    return None


def train_flops_per_token(matmul_params: int, num_layers: int, attention_width: int, seq_len: float) -> float:
    """Forward + backward FLOPs per token: 6 x matmul parameters + 12 x layers x (heads x head_dim) x the
    sequence length the token attends over (no causal discount, as verl and Megatron count)."""
    return 6.0 * matmul_params + 12.0 * num_layers * attention_width * seq_len


def mfu(flops: float, seconds: float, peak: float, gpus: int) -> float:
    """The fraction of `gpus` GPUs' peak that `flops` in `seconds` is (0 when no time was measured)."""
    return flops / (seconds * peak * gpus) if seconds > 0 and peak > 0 and gpus > 0 else 0.0


def memory_metrics(cuda: bool) -> dict[str, float]:
    """perf/cpu_memory_used_gb (this process's resident memory), and on GPU perf/max_memory_allocated_gb and
    perf/max_memory_reserved_gb (the peaks since the last reset; the caller resets them each step)."""
    out = {"perf/cpu_memory_used_gb": psutil.Process().memory_info().rss / GIB}
    if cuda:
        out["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / GIB
        out["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / GIB
    return out


class ActorMFU:
    """perf/mfu/actor of a run. arch: the model's shape (distflow.plan.model_size.ModelArch or anything with
    its num_layers, num_heads, head_dim, active_params, embedding_params, tie_embeddings); peak: one GPU's
    FLOP/s; gpus: the actor's training GPUs; epochs: actor.ppo_epochs (passes over the step's batch)."""

    def __init__(self, arch, peak: float, gpus: int, epochs: int):
        # The input embedding is a lookup; a tied output layer still multiplies by it.
        lookup = 0 if arch.tie_embeddings else arch.embedding_params
        self.matmul_params = arch.active_params - lookup
        self.num_layers, self.attention_width = arch.num_layers, arch.num_heads * arch.head_dim
        self.peak, self.gpus, self.epochs = peak, gpus, epochs

    def metrics(self, step_metrics: dict) -> dict[str, float]:
        """{"perf/mfu/actor": ...} from the step's reduced metrics (rollout/tokens and rollout/samples, every
        sample trained on; timing_s/train_actor), or {} when they are missing."""
        tokens, samples = step_metrics.get("rollout/tokens"), step_metrics.get("rollout/samples")
        seconds = step_metrics.get("timing_s/train_actor")
        if not tokens or not samples or not seconds:
            return {}
        per_token = train_flops_per_token(
            self.matmul_params, self.num_layers, self.attention_width, seq_len=tokens / samples
        )
        return {"perf/mfu/actor": mfu(per_token * tokens * self.epochs, seconds, self.peak, self.gpus)}
