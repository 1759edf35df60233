"""Executes a WeightSyncPlan on every rank: moves each piece of each Megatron shard straight into the staging
buffer of the engine rank that needs it, and has each engine's owner load the buckets into the engine.

Transfer (colocated, same node): every engine rank's host keeps two staging buffers in shared memory (CUDA
IPC memory on GPU), each the size of that rank's largest bucket, allocated once. Their handles (a few
hundred bytes) are exchanged once; after that each training rank writes the pieces it holds directly into
the staging buffers (no funnel through one rank; every stage and TP rank writes at once), the ranks agree
that the bucket is complete (one all_gather of small status objects, which also carries errors and
checksum shares and, from each engine rank's host, handles to that rank's views of the bucket), and the
engine owner hands SGLang one `LocalSerializedTensor` per tensor whose entry r is engine rank r's view, its
handle made on rank r's own node (`load_format="direct"`: each scheduler copies its own view into its own
parameter; so an engine spanning nodes loads the same way; row ranges of a parameter larger than a bucket
go through engine_side.load_counted, which writes them into the parameter's rows). Buckets alternate
between the two buffers, so ranks fill bucket b+1 while the owner loads bucket b. The whole sync is one begin/end_weight_update session; the last load flushes the
engine's KV/prefix cache.

Failures: any rank's exception (or the engine dying: engine_health fails the waiting engine call within about
a second, with the engine log's tail) is reported in the next status exchange, every rank raises
WeightSyncError naming the rank and the cause, and the engine stays marked stale (engine_state). Megatron's
weights are only read.
sync.verify: the owner asks every engine rank for the checksum of each parameter (engine_side.probe) and
compares, per bucket, with the sum of the shares the senders computed from their own shards.
Engine ranks on another node than a sender (disaggregated placement across nodes), or every sender/host pair
with sync.transport=process_group, are reached over a weight-update process group instead (group_transport):
the sender packs its pieces for that host, they travel once every rank has packed its bucket, and the host
writes them into its staging buffer.
"""
import contextlib
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.distributed as dist

from distflow.config.dtypes import torch_dtype
from distflow.coordination.weights import checksum as wsum
from distflow.coordination.weights import engine_side
from distflow.coordination.weights.group_transport import GroupTransport
from distflow.coordination.weights.plan import WeightSyncPlan, plan_weight_sync
from distflow.coordination.weights.regions import narrow
from distflow.models.tp_sharding import LOCAL_EXPERT as _LOCAL_EXPERT
from distflow.workers.rollout import engine_health
from distflow.workers.rollout.engine_health import EngineDiedError  # noqa: F401 - re-exported
from distflow.workers.rollout.engine_state import state_of

logger = logging.getLogger(__name__)



class WeightSyncError(RuntimeError):
    """A weight sync failed; raised on every rank. The engine keeps serving nothing until a sync succeeds."""


@dataclass
class SyncStats:
    version: int
    seconds: float
    """Wall time of the sync on the slowest rank."""
    total_bytes: int
    """Bytes loaded into all engines."""
    busiest_sender_bytes: int
    busiest_sender: int
    buckets: int
    receiver_bytes: dict = field(default_factory=dict)
    """(engine, engine rank) -> bytes that rank received."""
    verified: bool = False
    group_bytes: int = 0
    """Bytes that travelled over the weight-update process group (group_transport), all senders together."""

    @property
    def gb_per_s(self) -> float:
        return self.total_bytes / max(self.seconds, 1e-9) / 1e9

    def metrics(self) -> dict[str, float]:
        return {"sync/seconds": self.seconds, "sync/bytes": float(self.total_bytes),
                "sync/busiest_rank_bytes": float(self.busiest_sender_bytes), "sync/gbps": self.gb_per_s,
                "sync/version": float(self.version), "sync/buckets": float(self.buckets),
                "sync/group_bytes": float(self.group_bytes)}


class WeightResharder:
    """Pushes this rank's Megatron shards into the rollout engines, as `plan` says. Collective: every rank
    of the default process group constructs one and calls sync() together.

    local_tensors: this rank's Megatron parameters under global names (decoder.layers.<global layer>.*).
    engine: the sglang.Engine on the rank that owns one (plan.owners), else None; it must have been started
    with extra_args=engine_side.engine_args(). engine_dtype: the engine's parameter dtype.
    load_format: "direct" (SGLang's) or engine_side.LOAD_COUNTED (the same, counting received bytes).
    on_bucket(bucket index): called on every rank before it writes a bucket (progress; tests inject faults).
    """

    def __init__(self, plan: WeightSyncPlan, local_tensors: dict[str, torch.Tensor], *, engine=None,
                 engine_dtype: torch.dtype = torch.float32, verify: bool = False, load_format: str = "direct",
                 on_bucket=None, transport: str = "auto", timeout_s: float | None = None):
        assert plan.element_size == torch.empty(0, dtype=engine_dtype).element_size(), "plan/engine dtype mismatch"
        self.plan, self.local, self.dtype = plan, local_tensors, engine_dtype
        self.verify, self.load_format, self.on_bucket = verify, load_format, on_bucket
        self.rank = dist.get_rank()
        self.version = 0
        self.engine_index = plan.owners.index(self.rank) if self.rank in plan.owners else None
        self.engine = engine
        if self.engine_index is not None:
            if engine is None:
                raise ValueError(f"rank {self.rank} owns engine {self.engine_index} but was given no engine")
            _check_engine_args(engine)
        self._staging = {}  # (engine, rank, slot) -> tensor, on hosts (own) and writers/owners (opened)
        self._ready = False  # staging buffers allocated and opened on every rank
        self._engine_checked = False
        self.last_engine_reports = None
        """Owner with verify: each engine rank's probe report after the last sync (engine_side.probe)."""
        self._writes = self._index_writes()
        self._check_local_tensors()
        self.transport = GroupTransport(plan, self.rank, transport, self._device(), timeout_s)
        self._outgoing: dict[int, list[torch.Tensor]] = {}  # host -> this bucket's pieces for the group
        self._bucket_handles: dict = {}  # (engine, engine rank) -> this bucket's handles from its host

    @classmethod
    def for_megatron_worker(cls, worker, placement, sync_cfg, *, engine=None, engine_dtype: str = "float32",
                            mode: str = "auto", **kwargs) -> "WeightResharder":
        """The resharder for a MegatronWorker's model (every rank of the placement calls this or, on a rank
        without the worker, for_rollout_rank)."""
        plan = plan_weight_sync(worker.spec, worker.checkpoint.config, worker.layout, placement,
                                bucket_bytes=int(sync_cfg.bucket_mb * 2**20),
                                element_size=torch_dtype(engine_dtype).itemsize, mode=mode,
                                padded_vocab=worker.chunks[0].vocab_size, engine_device=worker.device.type)
        return cls(plan, megatron_tensors(worker.chunks, worker.config), engine=engine,
                   engine_dtype=torch_dtype(engine_dtype), verify=sync_cfg.verify, transport=sync_cfg.transport, **kwargs)

    @classmethod
    def for_rollout_rank(cls, model_path: str, layout, placement, sync_cfg, *, engine=None,
                         engine_dtype: str = "float32", engine_device: str = "cpu", mode: str = "auto",
                         **kwargs) -> "WeightResharder":
        """The resharder on a rank that hosts engines and trains nothing (disaggregated placement): the same
        plan as the training ranks' (Megatron's default vocabulary padding, as the worker builds it), no
        tensors of its own to send."""
        from distflow.models.conversion import HFCheckpoint
        from distflow.models.registry import spec_for

        config = HFCheckpoint(model_path).config
        plan = plan_weight_sync(spec_for(config), config, layout, placement,
                                bucket_bytes=int(sync_cfg.bucket_mb * 2**20),
                                element_size=torch_dtype(engine_dtype).itemsize, mode=mode, engine_device=engine_device)
        return cls(plan, {}, engine=engine, engine_dtype=torch_dtype(engine_dtype), verify=sync_cfg.verify,
                   transport=sync_cfg.transport, **kwargs)

    # ---- the sync ---------------------------------------------------------------------------------------

    def sync(self, local_tensors: dict[str, torch.Tensor] | None = None) -> SyncStats:
        """Moves the current weights into every engine; returns the same SyncStats on every rank.

        local_tensors: this rank's parameters again (megatron_tensors), for a trainer whose optimizer may have
        replaced parameter storage since the resharder was built; checked against the plan like the first."""
        if local_tensors is not None:
            self.local = local_tensors
            self._check_local_tensors()
        version = self.version + 1
        tic = time.perf_counter()
        sent, group_sent_before = 0, self.transport.sent_bytes
        expected: dict = {}  # (engine, rank, name) -> checksum shares
        with _file_system_sharing():
            error = None
            if not self._ready:  # first sync (or after a failed one): staging buffers and their handles
                error, host, handles = self._safe(self._allocate)
                error = self._safe(self._open, self._exchange(error, (host, handles)))[0]
            if self.engine is not None and error is None:
                error = self._safe(self._begin, version)[0]
            pending = error  # a local error so far, reported at the next exchange (before any load)
            for b in range(len(self.plan.buckets)):
                error, shares, n = self._safe(self._write_bucket, b) if pending is None else (pending, None, 0)
                sent += n or 0
                handles = self._safe(self._serialize_hosted, b)[1] if error is None else None
                self._bucket_handles = {}
                for _, (status, hosted) in self._exchange(error, (shares, handles)):
                    for key, value in (status or {}).items():
                        expected.setdefault(key, []).append(value)
                    self._bucket_handles.update(hosted or {})
                if self.transport.uses_group(b):  # every rank packed its pieces: now they travel
                    error, shares = self._safe(self._transfer_bucket, b)[:2]
                    for _, status in self._exchange(error, shares):
                        for key, value in (status or {}).items():
                            expected.setdefault(key, []).append(value)
                self._ready = True
                pending = self._safe(self._load_bucket, b)[0] if self.engine is not None else None
            if self.engine is not None and pending is None:
                pending = self._safe(self._finish, expected)[0]
            statuses = self._exchange(pending, {"seconds": time.perf_counter() - tic, "sent": sent,
                                                "group_sent": self.transport.sent_bytes - group_sent_before})
        self.version = version
        if self.engine is not None:
            state = state_of(self.engine)
            state.version, state.stale_reason = version, None
        seconds = max(s["seconds"] for _, s in statuses)
        busiest = max(range(len(statuses)), key=lambda r: statuses[r][1]["sent"])
        receivers = {(e, r): self.plan.receiver_bytes(e, r) for e in range(len(self.plan.engines))
                     for r in range(self.plan.engine_tp)}
        return SyncStats(version=version, seconds=seconds, total_bytes=self.plan.total_bytes,
                         busiest_sender_bytes=statuses[busiest][1]["sent"], busiest_sender=busiest,
                         buckets=len(self.plan.buckets), receiver_bytes=receivers, verified=self.verify,
                         group_bytes=sum(s["group_sent"] for _, s in statuses))

    def _exchange(self, error, payload=None) -> list:
        """All-gathers (error, payload) and raises WeightSyncError on every rank if any rank reported one."""
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (error, payload))
        failed = [(r, e) for r, (e, _) in enumerate(gathered) if e]
        if not failed:
            return gathered
        rank, message = failed[0]
        text = (f"weight sync to version {self.version + 1} failed on rank {rank}: {message}"
                + (f" (and on ranks {[r for r, _ in failed[1:]]})" if len(failed) > 1 else ""))
        if self.engine is not None:
            self._abort(text)
        raise WeightSyncError(text + "; an engine whose update began is stale until a sync succeeds")

    def _safe(self, fn, *args):
        """(error text or None, *results): local failures are reported at the next exchange, not raised."""
        try:
            out = fn(*args)
        except Exception as exc:  # noqa: BLE001 - every rank must reach the exchange to hear about it
            return (f"{type(exc).__name__}: {exc}", None, None)
        return (None, *(out if isinstance(out, tuple) else (out, None)))

    # ---- steps --------------------------------------------------------------------------------------------

    def _allocate(self) -> dict:
        """Hosts allocate their engine ranks' two staging buffers; returns their handles."""
        from sglang.srt.utils import MultiprocessingSerializer

        self._staging = {}
        for e, ranks in enumerate(self.plan.engines):
            for rp in ranks:
                if rp.host == self.rank:
                    numel = max(sum(t.numel for t in self.plan.bucket_targets(b, e, rp.rank))
                                for b in range(len(self.plan.buckets)))
                    for slot in (0, 1):
                        self._staging[(e, rp.rank, slot)] = _shared_empty(numel, self.dtype, self._device())
        return socket.gethostname(), {k: MultiprocessingSerializer.serialize(v) for k, v in self._staging.items()}

    def _open(self, gathered: list) -> None:
        """Opens the other hosts' staging buffers this rank writes into (owners load through handles their
        hosts make: _serialize_hosted)."""
        from sglang.srt.utils import MultiprocessingSerializer

        self.transport.set_hostnames([host for _, (host, _) in gathered])
        needed = {(e, r) for items in self._writes.values() for e, r, *_ in items
                  if not self.transport.via_group(self.rank, self.plan.engines[e][r].host)}
        needed |= {(e, r) for items in self._zero_fills.values() for e, r, *_ in items}
        here = socket.gethostname()
        for rank, (_, (host, handles)) in enumerate(gathered):
            for (e, r, slot), handle in handles.items():
                if (e, r) not in needed or (e, r, slot) in self._staging:
                    continue
                if host != here:
                    raise ValueError(
                        f"engine {e} rank {r} is staged on rank {rank} ({host}), another node than rank {self.rank} "
                        f"({here}): shared memory cannot reach it; use sync.transport=auto or process_group")
                self._staging[(e, r, slot)] = MultiprocessingSerializer.deserialize(handle)

    def _begin(self, version: int):
        if not self._engine_checked:
            self._check_engine_layout()
            self._engine_checked = True
        elif self.load_format == engine_side.LOAD_COUNTED:
            self.probe_engine(checksums=False)  # zero the engine ranks' received-bytes counters
        state_of(self.engine).stale_reason = f"weight sync to version {version} in progress"
        self._call("begin_weight_update", "begin_weight_update")

    def _write_bucket(self, b: int):
        if self.on_bucket is not None:
            self.on_bucket(b)
        shares, sent = {}, 0
        slot = b % 2
        self._outgoing = {}
        for e, r, target, offset in self._zero_fills.get(b, ()):  # rows no piece writes: no race with writers
            first, count = target.padding_rows
            self._staging[(e, r, slot)][offset:offset + target.numel].view(target.shape)[first:first + count].zero_()
        with torch.no_grad():
            for e, r, target, offset, piece in self._writes.get(b, ()):
                host = self.plan.engines[e][r].host
                if self.transport.via_group(self.rank, host):  # sent after every rank has packed (sync)
                    self._outgoing.setdefault(host, []).append(narrow(self.local[piece.src_name], piece.src))
                    sent += piece.numel * self.plan.element_size
                    continue
                dst = narrow(self._staging[(e, r, slot)][offset:offset + target.numel].view(target.shape), piece.dst)
                src = narrow(self.local[piece.src_name], piece.src)
                dst.copy_(src)
                sent += piece.numel * self.plan.element_size
                if self.verify:
                    key = (e, r, target.param_name)
                    share = wsum.region_checksum(dst, target.param_shape, target.in_param(piece.dst))
                    shares[key] = (shares.get(key, 0) + share) % wsum.MODULUS
        return shares, sent

    def _transfer_bucket(self, b: int):
        shares = self.transport.transfer(b, self._outgoing, self._staging, self.dtype, self.verify)
        self._outgoing = {}
        return shares

    def _serialize_hosted(self, b: int) -> dict:
        """(engine, engine rank) -> a handle per tensor of bucket b, for the engine ranks this rank hosts and
        does not own: their owner hands SGLang handles made where the memory lives, so the engine rank's
        scheduler (on this node) can open them even when the owner runs on another node."""
        from sglang.srt.utils import MultiprocessingSerializer

        if self.plan.shared:
            return {}
        out = {}
        for e, ranks in enumerate(self.plan.engines):
            for rp in ranks:
                if rp.host == self.rank and self.plan.owners[e] != self.rank:
                    out[(e, rp.rank)] = [MultiprocessingSerializer.serialize(v) for v in self._views(b, e, rp)]
        return out

    def _views(self, b: int, e: int, rp) -> list[torch.Tensor]:
        """Bucket b's tensors in engine rank rp's staging buffer, in bucket order."""
        views, offset = [], 0
        for name in self.plan.buckets[b]:
            target = rp.by_name[name]
            views.append(self._staging[(e, rp.rank, b % 2)][offset:offset + target.numel].view(target.shape))
            offset += target.numel
        return views

    def _load_bucket(self, b: int):
        from sglang.srt.model_executor.model_runner_components.weight_updater import LocalSerializedTensor
        from sglang.srt.utils import MultiprocessingSerializer

        e = self.engine_index
        ranks = self.plan.engines[e]
        views = {rp.rank: self._views(b, e, rp) for rp in ranks if rp.host == self.rank}
        named = []
        for j, name in enumerate(self.plan.buckets[b]):
            values = []
            for rp in ranks:
                if rp.host == self.rank:
                    view = views[rp.rank][j]
                    values.append(MultiprocessingSerializer.serialize(view))
                else:  # made by its host (_serialize_hosted)
                    values.append(self._bucket_handles[(e, rp.rank)][j])
            if self.plan.shared:  # HF fallback: every engine rank reads rank 0's buffer
                # One handle per reader: each serialization holds one reference on the shared memory that one
                # deserialization releases (torch's file_system strategy); a handle read twice releases it
                # twice, and the buffer is unlinked under the next bucket.
                values += [MultiprocessingSerializer.serialize(view) for _ in range(self.plan.engine_tp - 1)]
            named.append((name, LocalSerializedTensor(values=values)))
        # Row ranges of a parameter split over buckets need the loader that writes into a slice.
        split = b in self.plan.row_range_buckets
        load_format = None if self.plan.shared else engine_side.LOAD_COUNTED if split else self.load_format
        # The last load flushes the KV/prefix cache in the scheduler (engine.flush_cache() would also run a
        # full gc.collect() there on CPU: ~0.4 s).
        self._call(f"load of bucket {b}", "update_weights_from_tensor", named, load_format=load_format,
                   flush_cache=b == len(self.plan.buckets) - 1)

    def _finish(self, expected: dict):
        self._call("end_weight_update", "end_weight_update")
        if self.verify:
            self._verify(expected)
        elif self._counted_loads:
            # The counted loader records what it could not load (raising would kill the scheduler): report it.
            self._raise_load_errors(self.probe_engine(checksums=False))

    @cached_property
    def _counted_loads(self) -> bool:
        """Whether this engine's loads go through engine_side.load_counted (always for split parameters)."""
        return not self.plan.shared and (self.load_format == engine_side.LOAD_COUNTED
                                         or bool(self.plan.row_range_buckets))

    def _raise_load_errors(self, reports: list[dict]):
        for rp, report in zip(self.plan.engines[self.engine_index], reports):
            if report["errors"]:
                raise WeightVerifyError(f"engine rank {rp.rank} rejected tensors: {report['errors'][:3]}")

    def _abort(self, reason: str):
        """After a failure: the engine stays stale; close its weight-update session unless it is dead."""
        state = state_of(self.engine)
        if state.stale_reason is not None:
            state.stale_reason = reason
        if not engine_health.is_dead(self.engine):
            with contextlib.suppress(Exception):
                self.engine.end_weight_update()

    # ---- verification -----------------------------------------------------------------------------------

    def probe_engine(self, checksums: bool) -> list[dict]:
        """Owner only: every engine rank's report (engine_side.probe): parameters, received bytes, errors."""
        with tempfile.TemporaryDirectory(prefix="distflow-probe-") as tmp:
            out = os.path.join(tmp, "report.pt")
            self._call("begin_weight_update (probe)", "begin_weight_update")
            try:
                self._call("probe", "update_weights_from_tensor", engine_side.probe_request(out, checksums),
                           load_format=engine_side.PROBE, flush_cache=False)
            finally:
                self._call("end_weight_update (probe)", "end_weight_update")
            return torch.load(out)

    def _check_engine_layout(self):
        """First sync: the plan's tensor names and shapes must be exactly the engine's parameters (a name
        the engine lacks would kill its scheduler mid-load)."""
        if self.plan.shared:
            return
        reports = self.probe_engine(checksums=False)
        for rp, report in zip(self.plan.engines[self.engine_index], reports):
            engine_params = {n: tuple(p["shape"]) for n, p in report["params"].items()}
            planned = {name: tuple(shape) for name, shape in rp.param_shapes.items()}
            for name in sorted(set(engine_params) | set(planned)):
                if engine_params.get(name) != planned.get(name):
                    raise ValueError(f"engine rank {rp.rank}: parameter {name!r} has shape {engine_params.get(name)} "
                                     f"in the engine but {planned.get(name)} in the weight plan "
                                     "(None: absent); the family's SGLang layout does not match this engine")

    def _verify(self, expected: dict):
        e = self.engine_index
        reports = self.last_engine_reports = self.probe_engine(checksums=True)
        self._raise_load_errors(reports)
        if self.plan.shared:
            return  # HF names: SGLang's loader fused them; the outputs are compared by tests
        for rp in self.plan.engines[e]:
            report = reports[rp.rank]
            for b, names in enumerate(self.plan.buckets):
                # A parameter sent in row ranges is checked whole, at its last range's bucket.
                params = [t.param_name for t in map(rp.by_name.get, names)
                          if t.param is None or t.row_offset + t.shape[0] == t.param_rows]
                want = {n: wsum.combine(expected.get((e, rp.rank, n), [])) for n in params}
                got = {n: report["params"][n]["checksum"] for n in params}
                if want != got:
                    bad = [n for n in params if want[n] != got[n]]
                    raise WeightVerifyError(f"bucket {b}: engine {e} rank {rp.rank} holds different weights than "
                                            f"the trainer sent for {bad}")

    # ---- bookkeeping ------------------------------------------------------------------------------------

    def _index_writes(self) -> dict:
        """bucket -> [(engine, rank, target, offset in the staging buffer, piece)] this rank writes."""
        writes, zero = {}, {}
        for b in range(len(self.plan.buckets)):
            for e, ranks in enumerate(self.plan.engines):
                for rp in ranks:
                    offset = 0
                    for target in self.plan.bucket_targets(b, e, rp.rank):
                        if target.padding_rows and rp.host == self.rank:
                            zero.setdefault(b, []).append((e, rp.rank, target, offset))
                        for piece in target.pieces:
                            if piece.src_rank == self.rank:
                                writes.setdefault(b, []).append((e, rp.rank, target, offset, piece))
                        offset += target.numel
        self._zero_fills = zero
        return writes

    def _check_local_tensors(self):
        for b, items in self._writes.items():
            for _, _, _, _, piece in items:
                tensor = self.local.get(piece.src_name)
                if tensor is None:
                    raise ValueError(f"rank {self.rank} holds no Megatron parameter {piece.src_name!r} that the weight "
                                     "plan reads from it (the plan assumes Megatron's even layer split over stages)")
                if any(s + n > size for (s, n), size in zip(piece.src, tensor.shape)):
                    raise ValueError(f"rank {self.rank}: {piece.src_name} has shape {tuple(tensor.shape)}, the plan "
                                     f"reads {piece.src}")

    def _device(self) -> torch.device:
        if self.local:
            return next(iter(self.local.values())).device
        # A rollout-only rank stages on its engine's device.
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

    def _call(self, what: str, method: str, *args, **kwargs):
        """Calls engine.<method>; raises on SGLang's (False, message) answers, and EngineDiedError (with the
        engine log's tail) on a dead engine, within about a second of the death (engine_health)."""
        result = engine_health.call(self.engine, f"{what} of the weight sync", getattr(self.engine, method),
                                    *args, **kwargs)
        ok, message = (result[0], result[1]) if isinstance(result, tuple) else (result is not False, "")
        if not ok:
            raise RuntimeError(f"engine {what} failed: {message}")
        return result


class WeightVerifyError(WeightSyncError):
    """sync.verify found engine weights that differ from what the trainer sent."""


def megatron_tensors(chunks: list, config) -> dict[str, torch.Tensor]:
    """This rank's Megatron parameters (every model chunk) under global names: decoder.layers.<global layer>,
    routed experts numbered globally (mlp.experts.local_experts.<ep rank * experts per rank + local>)."""
    from megatron.core import parallel_state as ps

    from distflow.workers.megatron.hf_io import chunk_layers

    vp_stages = list(range(len(chunks))) if len(chunks) > 1 else [getattr(chunks[0], "vp_stage", None)]
    experts_per_rank = (getattr(config, "num_moe_experts", None) or 0) // ps.get_expert_model_parallel_world_size()
    first_expert = ps.get_expert_model_parallel_rank() * experts_per_rank
    out = {}
    for chunk, vp in zip(chunks, vp_stages):
        offset, _ = chunk_layers(config, chunk, vp)
        for name, param in chunk.named_parameters():
            out[global_name(name, offset, first_expert)] = param.detach()
    return out


def global_name(local_name: str, layer_offset: int, first_expert: int = 0) -> str:
    """A model chunk's parameter name with its layer (and routed expert) numbered globally."""
    name = local_name
    if name.startswith("decoder.layers."):
        local, rest = name[len("decoder.layers."):].split(".", 1)
        name = f"decoder.layers.{layer_offset + int(local)}.{rest}"
    expert = _LOCAL_EXPERT.search(name)
    if expert:
        name = f"{name[:expert.start(1)]}{first_expert + int(expert.group(1))}{name[expert.end(1):]}"
    return name


def _shared_empty(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised 1-D tensor other processes can open: shared memory on CPU, plain memory on GPU
    (CUDA tensors are shared through IPC handles)."""
    if device.type != "cpu":
        return torch.empty(numel, dtype=dtype, device=device)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(max(1, numel) * itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))


@contextlib.contextmanager
def _file_system_sharing():
    """CPU tensors opened by processes that are not descendants of their creator (another trainer rank,
    the engine's schedulers) must be shared by file name, not by file descriptor."""
    import torch.multiprocessing as mp

    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        mp.set_sharing_strategy(previous)


def _check_engine_args(engine) -> None:
    loaders = list(getattr(getattr(engine, "server_args", None), "custom_weight_loader", None) or [])
    missing = [n for n in engine_side.engine_args()["custom_weight_loader"] if n not in loaders]
    if missing:
        raise ValueError(f"the engine was started without the weight-sync loaders {missing}; start it with "
                         "extra_args=distflow.coordination.weights.engine_side.engine_args()")

