"""A second process that plays one SGLang scheduler (engine TP rank 0) for the weight sync's staging path.

The GPU machine has no SGLang, yet the part of a sync that only a GPU can show is whether another process on
the same GPU opens the resharder's CUDA-IPC staging buffers and reads the right bytes. `SchedulerProcessEngine`
has the engine methods WeightResharder calls (begin/end_weight_update, update_weights_from_tensor) and forwards
each call to a spawned child. The child does what SGLang's scheduler does with a `LocalSerializedTensor`: it
opens entry 0 (MultiprocessingSerializer.deserialize: cudaIpcOpenMemHandle on GPU, shared memory on CPU) and
runs the load format it names, DistFlow's own engine-side loaders (engine_side.load_counted, engine_side.probe)
on a module whose parameters are the plan's engine-rank-0 tensors. SGLang's "direct" format copies by name as
load_counted does. The child times the opening and the copy of every load.
"""

import multiprocessing
import time

import torch
from gpu_checks import sglang_stand_in

from distflow.coordination.weights import engine_side


class SchedulerProcessEngine:
    """Stands in for an sglang.Engine of one TP rank in WeightResharder(engine=...)."""

    def __init__(self, param_shapes: dict, dtype: torch.dtype, device: torch.device, timeout_s: float):
        self.server_args = type("ServerArgs", (), {})()
        self.server_args.custom_weight_loader = engine_side.engine_args()["custom_weight_loader"]
        self.timeout_s = timeout_s
        self.load_stats: list[dict] = []
        """One entry per update_weights_from_tensor: {"bytes", "open_s", "copy_s", "tensors"}."""
        context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
        self._conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=serve, args=(child_conn, param_shapes, str(dtype), str(device)), daemon=True
        )
        self.process.start()
        self._request("ready")

    def begin_weight_update(self):
        return True, ""

    def end_weight_update(self):
        return True, ""

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=False):
        stats = self._request("load", list(named_tensors), load_format)
        self.load_stats.append(stats)
        return True, ""

    def shutdown(self) -> None:
        if self.process.is_alive():
            self._conn.send(("stop",))
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()

    def _request(self, *message):
        self._conn.send(message)
        if not self._conn.poll(self.timeout_s):
            raise TimeoutError(
                f"the scheduler process did not answer {message[0]!r} within {self.timeout_s} s"
            )
        ok, answer = self._conn.recv()
        if not ok:
            raise RuntimeError(f"scheduler process: {answer}")
        return answer


def serve(conn, param_shapes: dict, dtype_name: str, device_name: str) -> None:
    """The child: builds the engine-side module, then answers requests until "stop"."""
    sglang_stand_in.install()
    # One engine TP rank: the probe's gather over SGLang's TP group has only this rank to gather.
    engine_side._gather_to_tp_rank0 = lambda report: (0, [report])
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = engine_module(param_shapes, getattr(torch, dtype_name.removeprefix("torch.")), device)
    while True:
        message = conn.recv()
        try:
            if message[0] == "stop":
                return
            answer = {} if message[0] == "ready" else load(model, *message[1:], device=device)
            reply = (True, answer)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            reply = (False, f"{type(exc).__name__}: {exc}")
        # Drops the request's tensors (the probe's) before answering, as SGLang's scheduler does after a load:
        # shared memory lives while any process holds it, and the parent reads its memory after the answer.
        del message
        conn.send(reply)


def engine_module(param_shapes: dict, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A module whose named_parameters() are exactly `param_shapes` (SGLang's names, e.g. model.layers.0.*)."""
    root = torch.nn.Module()
    for name, shape in param_shapes.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        module.register_parameter(
            leaf, torch.nn.Parameter(torch.zeros(shape, dtype=dtype, device=device), requires_grad=False)
        )
    return root


def load(model, named_tensors, load_format, device) -> dict:
    from sglang.srt.model_executor.model_runner_components.weight_updater import LocalSerializedTensor

    tic = time.perf_counter()
    opened = [
        (name, value.get(0) if isinstance(value, LocalSerializedTensor) else value)
        for name, value in named_tensors
    ]
    _synchronize(device)
    opened_at = time.perf_counter()
    if load_format in (None, "direct", engine_side.LOAD_COUNTED):
        engine_side.load_counted(model, opened)
    elif load_format == engine_side.PROBE:
        engine_side.probe(model, opened)
    else:
        raise ValueError(
            f"load_format {load_format!r}: the scheduler process knows direct, load_counted, probe"
        )
    _synchronize(device)
    done = time.perf_counter()
    moved = 0 if load_format == engine_side.PROBE else sum(t.numel() * t.element_size() for _, t in opened)
    del opened  # closes the IPC handles, so that the owner's ipc_collect can free the buffers
    return {
        "bytes": moved,
        "open_s": opened_at - tic,
        "copy_s": done - opened_at,
        "tensors": len(named_tensors),
    }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
