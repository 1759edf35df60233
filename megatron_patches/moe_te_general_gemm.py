# Fixes a Megatron-Core 0.16.1 bug without Transformer Engine (on GPU too), in
# megatron/core/transformer/moe/moe_utils.py router_gating_linear (RouterGatingLinearFunction.forward):
#     if te_general_gemm is not None and router_dtype != torch.float64:
#         NameError: name 'te_general_gemm' is not defined
# The name is only bound when `from megatron.core.extensions.transformer_engine import ...` succeeds.
"""Binds moe_utils.te_general_gemm = None when Transformer Engine is absent, so the router takes torch's path.

None is exactly what the code's own `is not None` check expects for "no TE". Applied only when TE cannot be
imported (with TE the name is bound by the import), whether or not CUDA is present.
"""

from ._conditions import transformer_engine_missing

NAME = "moe_te_general_gemm"
needed = transformer_engine_missing


def _moe_utils():
    from megatron.core.transformer.moe import moe_utils

    return moe_utils


def is_applied() -> bool:
    return hasattr(_moe_utils(), "te_general_gemm")


def apply() -> None:
    # None cannot carry a marker; is_applied() checks for the name instead (already bound = nothing to fix).
    _moe_utils().te_general_gemm = None
