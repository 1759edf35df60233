"""CPU support for the unmodified SGLang engine and the torchvision wheel (active only without CUDA).

Megatron-Core's CPU patches live apart, in the top-level `megatron_patches` package.
"""
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent
STARTUP_DIR = _HERE / "startup"
SGL_KERNEL_STUB_DIR = _HERE / "sgl_kernel_stub"


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _prepend_path(env: dict, key: str, path: Path) -> None:
    parts = [p for p in env.get(key, "").split(os.pathsep) if p]
    if str(path) not in parts:
        env[key] = os.pathsep.join([str(path)] + parts)


def sglang_cpu_env(env: dict, engine_tp: int = 1) -> dict:
    """Returns a copy of `env` that lets `sglang.Engine(device="cpu")` start its scheduler subprocesses.

    - SGLANG_USE_CPU_ENGINE=1: without it the scheduler imports vllm's rotary kernel and dies;
    - the sgl_kernel stub and the torchvision start-up hook on PYTHONPATH: the schedulers start by spawn
      and import both before any of our code runs in them;
    - SGLANG_CPU_OMP_THREADS_BIND: with engine TP > 1 on a single-NUMA machine the schedulers assert
      without an explicit core binding; we give each rank its own core(s);
    - TORCHDYNAMO_DISABLE=1: TP > 1 otherwise compiles the vocab-parallel embedding (13-27 s first call);
    - TORCHELASTIC_USE_AGENT_STORE removed: under torchrun the schedulers inherit it and hang forever
      waiting to join torchrun's store.
    """
    env = dict(env)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    _prepend_path(env, "PYTHONPATH", SGL_KERNEL_STUB_DIR)
    _prepend_path(env, "PYTHONPATH", STARTUP_DIR)
    env.setdefault("TORCHDYNAMO_DISABLE", "1")
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    if engine_tp > 1 and "SGLANG_CPU_OMP_THREADS_BIND" not in env:
        env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_bind_spec(engine_tp)
    return env


def cpu_bind_spec(engine_tp: int, cpu_count: int | None = None) -> str:
    """SGLang's per-rank CPU binding, e.g. "0|1" for 2 ranks on 2 cores, "0-1|2-3" for 2 ranks on 4.

    With more ranks than cores, ranks share cores round-robin (slow but correct).
    """
    cpus = cpu_count or os.cpu_count() or 1
    per_rank = max(1, cpus // engine_tp)
    specs = []
    for rank in range(engine_tp):
        first = (rank * per_rank) % cpus
        last = first + per_rank - 1
        specs.append(str(first) if first == last else f"{first}-{last}")
    return "|".join(specs)
