"""Stand-in for SGLang's CPU kernel package (`sglang-kernel-cpu`), which is source-only and not on PyPI.

Why: with SGLANG_USE_CPU_ENGINE=1, SGLang's CPU code paths import a handful of names from `sgl_kernel` at
module level (e.g. `copy_all_layer_kv_cache_cpu`, `assign_req_to_token_pool_cpu`). On a CPU without AMX
every layer takes `forward_native` and none of them is called; the stub makes the imports succeed and any
real call fail loudly. It is put on PYTHONPATH only for engines started on CPU
(distflow.cpu_support.sglang_cpu_env). It registers no torch ops, so SGLang's AMX detection
(`hasattr(torch.ops.sgl_kernel, "convert_weight_packed")`) stays False.
"""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def _unavailable(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but DistFlow's CPU environment has no SGLang CPU kernels; "
            "this code path needs Intel AMX kernels or a GPU build of SGLang."
        )

    _unavailable.__name__ = name
    return _unavailable
