"""Code that runs inside SGLang's scheduler processes, as custom weight loaders (one per engine TP rank).

SGLang calls a loader registered with the engine argument `custom_weight_loader=[...]` (see
`engine_args()`) as `loader(model, named_tensors)` on every engine TP rank when the engine's
`update_weights_from_tensor(..., load_format="<module>.<function>")` runs. Two loaders:
- `load_counted`: SGLang's load_format="direct" (copy each tensor into the parameter of that name; a name
  `<param>[a:b]` into rows a..b of it, for parameters sent in row ranges) that also counts the bytes this
  rank received; a name or shape that does not match is recorded, not raised (an
  exception here kills the scheduler and with it the engine);
- `probe`: reports, for every parameter of this rank, its shape, dtype and (optionally) checksum, plus the
  received-bytes count and recorded errors. The request is a uint8 tensor holding JSON {"out": path,
  "checksums": bool}; TP rank 0 gathers every rank's report over SGLang's CPU group and writes it to `out`
  with torch.save (on the node of the engine's owner).
Imports stay light: this module is imported by every scheduler.
"""

import json
import os

import torch

from distflow.coordination.weights.checksum import checksum

PROBE = f"{__name__}.probe"
LOAD_COUNTED = f"{__name__}.load_counted"
PROBE_TENSOR_NAME = "__distflow_probe__"

_received = {"bytes": 0, "tensors": 0, "errors": []}


def engine_args() -> dict:
    """The SGLang ServerArgs the weight sync needs (pass as start_engine(extra_args=...))."""
    return {"custom_weight_loader": [PROBE, LOAD_COUNTED]}


def probe_request(out_path: str, checksums: bool) -> list[tuple[str, torch.Tensor]]:
    payload = json.dumps({"out": str(out_path), "checksums": checksums}).encode()
    return [(PROBE_TENSOR_NAME, torch.frombuffer(bytearray(payload), dtype=torch.uint8))]


def load_counted(model, named_tensors) -> None:
    params = dict(model.named_parameters())
    for name, tensor in named_tensors:
        name, rows = _split_name(name)
        param = params.get(name)
        data = None if param is None else param.data if rows is None else param.data[rows[0] : rows[1]]
        if data is None or tuple(data.shape) != tuple(tensor.shape):
            got = None if data is None else tuple(data.shape)
            _received["errors"].append(
                f"{name}{'' if rows is None else list(rows)}: engine parameter {got}, "
                f"received {tuple(tensor.shape)}"
            )
            continue
        data.copy_(tensor)
        _received["bytes"] += tensor.numel() * tensor.element_size()
        _received["tensors"] += 1


def _split_name(name: str) -> tuple[str, tuple[int, int] | None]:
    """'<param>[a:b]' (rows a..b of a parameter the weight plan split over buckets) -> (param, (a, b))."""
    if not name.endswith("]") or "[" not in name:
        return name, None
    param, rows = name[:-1].rsplit("[", 1)
    first, stop = rows.split(":")
    return param, (int(first), int(stop))


def probe(model, named_tensors) -> None:
    ((name, request),) = named_tensors
    assert name == PROBE_TENSOR_NAME, f"probe called with {name!r}"
    request = json.loads(bytes(request.cpu().tolist()).decode())
    params = {}
    for pname, param in model.named_parameters():
        params[pname] = dict(
            shape=tuple(param.shape),
            dtype=str(param.dtype).removeprefix("torch."),
            checksum=checksum(param.data) if request["checksums"] else None,
        )
    report = dict(
        params=params,
        received_bytes=_received["bytes"],
        received_tensors=_received["tensors"],
        errors=list(_received["errors"]),
        pid=os.getpid(),
    )
    _received.update(bytes=0, tensors=0, errors=[])
    rank, reports = _gather_to_tp_rank0(report)
    if rank == 0:
        tmp = request["out"] + ".tmp"
        torch.save(reports, tmp)
        os.replace(tmp, request["out"])


def _gather_to_tp_rank0(report):
    from sglang.srt.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    if group.world_size == 1:
        return 0, [report]
    gathered = [None] * group.world_size if group.rank_in_group == 0 else None
    torch.distributed.gather_object(report, gathered, dst=group.ranks[0], group=group.cpu_group)
    return group.rank_in_group, gathered
