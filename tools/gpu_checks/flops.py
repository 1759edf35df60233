"""Model FLOPs of the Megatron passes, and the GPU peaks MFU is measured against.

Per sequence of s tokens (PaLM's accounting: Chowdhery et al. 2022, "PaLM", appendix B): a forward pass costs
2 * N * s for the weight matmuls (N: parameters that take part in matmuls, the logits layer included) plus
4 * L * d_attn * s^2 for attention scores and their weighted sum (L layers, d_attn = heads * head_dim), counted
whole as PaLM does, although a causal mask could skip half. A training step (forward and backward) is 3 times
the forward. Only a row's real tokens count: padding inside a micro-batch is work the MFU does not credit.
"""

import torch

# Dense (no sparsity) bf16 Tensor Core peak, FLOP/s. NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200):
# "BF16 Tensor Core 1,979 TFLOPS" with sparsity; dense is half. H100 SXM: the same figure (H100 datasheet).
BF16_DENSE_PEAK = {"H200": 989e12, "H100": 989e12}


def forward_flops(lengths: list[int], matmul_parameters: int, layers: int, attention_width: int) -> float:
    return float(sum(2 * matmul_parameters * s + 4 * layers * attention_width * s * s for s in lengths))


def train_flops(lengths: list[int], matmul_parameters: int, layers: int, attention_width: int) -> float:
    return 3 * forward_flops(lengths, matmul_parameters, layers, attention_width)


def device_peak(override_tflops: float | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s, where it comes from) for this process's GPU; (None, why) where unknown."""
    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops"
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    name = torch.cuda.get_device_name()
    for key, peak in BF16_DENSE_PEAK.items():
        if key in name:
            return peak, f"{key} dense bf16 datasheet peak"
    return None, f"no peak known for {name!r}: pass --peak-tflops"
