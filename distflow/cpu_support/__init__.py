"""CPU support for the unmodified SGLang engine and the torchvision wheel (active only without CUDA).

Megatron-Core's CPU patches live apart, in the top-level `megatron_patches` package.
"""

import contextlib
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
STARTUP_DIR = _HERE / "startup"
SGL_KERNEL_STUB_DIR = _HERE / "sgl_kernel_stub"


def cuda_available() -> bool:
    import torch  # noqa: PLC0415 - config imports this package and stays torch-free

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
    - OMP_NUM_THREADS (TP > 1, unless set): each rank gets its share of the cores; the CPU path does not
      bind threads itself, and 2 ranks x 2 threads on 2 cores ran 3x slower;
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
    if engine_tp > 1:
        env.setdefault("SGLANG_CPU_OMP_THREADS_BIND", cpu_bind_spec(engine_tp))
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // engine_tp)))
    return env


@contextlib.contextmanager
def sglang_cpu_launch(engine_tp: int = 1):
    """Applies `sglang_cpu_env` to this process while an engine is built, then restores it exactly.

    The engine's subprocesses inherit the environment when they are spawned, so the overlay only has to last
    for the construction. The calling process needs it too: importing SGLang's engine with
    SGLANG_USE_CPU_ENGINE=1 imports `sgl_kernel` here as well (hence the stub on sys.path), and SGLang caches
    its platform check (`is_cpu()`) at first use. Every variable SGLang itself sets in os.environ during
    the construction (NCCL_*, CUDA_DEVICE_MAX_CONNECTIONS, ...) is rolled back as well, so that code
    sharing the process (Megatron) sees the environment it had.
    """
    saved_env, saved_path = dict(os.environ), list(sys.path)
    apply_environ(sglang_cpu_env(saved_env, engine_tp))
    sys.path.insert(0, str(SGL_KERNEL_STUB_DIR))
    try:
        _check_sglang_platform_not_cached_as_gpu()
        yield
    finally:
        apply_environ(saved_env)
        sys.path[:] = saved_path


def apply_environ(target: dict) -> None:
    """Makes os.environ equal to `target`, touching only the variables that differ."""
    for key in [k for k in os.environ if k not in target]:
        del os.environ[key]
    for key, value in target.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _check_sglang_platform_not_cached_as_gpu() -> None:
    common = sys.modules.get("sglang.srt.utils.common")
    if common is not None and not common.is_cpu():
        raise RuntimeError(
            "SGLang was imported in this process without the CPU environment, and it caches that choice "
            "(sglang.srt.utils.common.is_cpu() is False). Start the engine before other code imports "
            "sglang.srt, or import it inside distflow.cpu_support.sglang_cpu_launch()."
        )


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
