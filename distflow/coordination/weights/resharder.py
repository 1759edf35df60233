"""Executes a WeightSyncPlan on every rank: moves each piece of each Megatron shard straight into the staging
buffer of the engine rank that needs it, and has each engine's owner load the buckets into the engine.

One sync, on every rank: the staging buffers are allocated once and their handles exchanged (staging); per
bucket, each rank stages the pieces it holds (shared_memory_transport writes them at once into buffers on
its node; group_transport packs those for another node's engine ranks and sends them once every rank has
packed), the ranks agree that the bucket is complete (one all_gather of small status objects, which also
carries errors and checksum shares and, from each engine rank's host, handles to that rank's views of the
bucket), and the engine owner hands SGLang one `LocalSerializedTensor` per tensor whose entry r is engine
rank r's view, its handle made on rank r's own node (`load_format="direct"`: each scheduler copies its own
view into its own parameter; so an engine spanning nodes loads the same way; row ranges of a parameter
larger than a bucket go through engine_side.load_counted, which writes them into the parameter's rows).
Buckets alternate between the two buffers, so ranks fill bucket b+1 while the owner loads bucket b. The
whole sync is one begin/end_weight_update session; the last load flushes the engine's KV/prefix cache.

Failures: any rank's exception (or the engine dying: engine_health fails the waiting engine call within about
a second, with the engine log's tail) is reported in the next status exchange (rank_errors), every rank
raises WeightSyncError naming the rank and the cause, and the engine stays marked stale (engine_state).
Megatron's weights are only read. What the engine loaded is checked by verification (sync.verify).
"""

import contextlib
import logging
import socket
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.distributed as dist

from distflow.config.dtypes import torch_dtype
from distflow.coordination.weights import engine_side
from distflow.coordination.weights.group_transport import GroupTransport
from distflow.coordination.weights.megatron_names import megatron_tensors
from distflow.coordination.weights.plan import WeightSyncPlan, plan_weight_sync
from distflow.coordination.weights.rank_errors import RankErrors
from distflow.coordination.weights.regions import narrow
from distflow.coordination.weights.shared_memory_transport import SharedMemoryTransport
from distflow.coordination.weights.staging import StagingBuffers, file_system_sharing
from distflow.coordination.weights.verification import EngineVerifier
from distflow.models.conversion import HFCheckpoint
from distflow.models.registry import spec_for
from distflow.workers.rollout import engine_health
from distflow.workers.rollout.engine_state import state_of

logger = logging.getLogger(__name__)


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
    phases: dict = field(default_factory=dict)
    """Phase -> seconds the rank that spent longest in it spent (PHASES; the closing exchange is not in it)."""

    @property
    def gb_per_s(self) -> float:
        return self.total_bytes / max(self.seconds, 1e-9) / 1e9

    def metrics(self) -> dict[str, float]:
        return {
            "sync/seconds": self.seconds,
            "sync/bytes": float(self.total_bytes),
            "sync/busiest_rank_bytes": float(self.busiest_sender_bytes),
            "sync/gbps": self.gb_per_s,
            "sync/version": float(self.version),
            "sync/buckets": float(self.buckets),
            "sync/group_bytes": float(self.group_bytes),
            **{f"sync/phase_s/{name}": seconds for name, seconds in self.phases.items()},
        }


# Where a sync's time goes, per rank (SyncStats.phases): staging its pieces (write), the status exchanges after
# each bucket and delivery (exchange: also the wait for the slowest rank), sending packed pieces to another
# node (deliver), and on the engine owner the engine's calls (engine_begin, engine_load, engine_finish: also the
# verification). The first sync's set-up (staging buffers and their handles) is not among them.
PHASES = ("write", "exchange", "deliver", "engine_begin", "engine_load", "engine_finish")


class _PhaseClock:
    """Seconds per phase of one rank's sync: `with clock("write"): ...` adds the block's time."""

    def __init__(self):
        self.seconds = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        tic = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - tic


class WeightResharder:
    """Pushes this rank's Megatron shards into the rollout engines, as `plan` says. Collective: every rank
    of the default process group constructs one and calls sync() together.

    local_tensors: this rank's Megatron parameters under global names (decoder.layers.<global layer>.*).
    engine: the sglang.Engine on the rank that owns one (plan.owners), else None; it must have been started
    with extra_args=engine_side.engine_args(). engine_dtype: the engine's parameter dtype.
    load_format: "direct" (SGLang's) or engine_side.LOAD_COUNTED (the same, counting received bytes).
    on_bucket(bucket index): called on every rank before it writes a bucket (progress; tests inject faults).
    """

    def __init__(
        self,
        plan: WeightSyncPlan,
        local_tensors: dict[str, torch.Tensor],
        *,
        engine=None,
        engine_dtype: torch.dtype = torch.float32,
        verify: bool = False,
        load_format: str = "direct",
        on_bucket=None,
        transport: str = "auto",
        timeout_s: float | None = None,
    ):
        assert plan.element_size == torch.empty(0, dtype=engine_dtype).element_size(), (
            "plan/engine dtype mismatch"
        )
        self.plan, self.local, self.dtype = plan, local_tensors, engine_dtype
        self.verify, self.load_format, self.on_bucket = verify, load_format, on_bucket
        self.rank = dist.get_rank()
        self.version = 0
        self.engine_index = plan.owners.index(self.rank) if self.rank in plan.owners else None
        self.engine = engine
        self._verifier = None  # the engine owner's checks of what its engine holds
        if self.engine_index is not None:
            if engine is None:
                raise ValueError(f"rank {self.rank} owns engine {self.engine_index} but was given no engine")
            _check_engine_args(engine)
            self._verifier = EngineVerifier(plan, self.engine_index, self._call)
        self._ready = False  # staging buffers allocated and opened on every rank
        self._engine_checked = False
        self._writes = self._index_writes()
        self._check_local_tensors()
        self.staging = StagingBuffers(plan, self.rank, engine_dtype, self._device())
        self.shared_memory = SharedMemoryTransport(self.staging, verify)
        self.group_transport = GroupTransport(plan, self.rank, transport, self.staging, verify, timeout_s)
        self._bucket_handles: dict = {}  # (engine, engine rank) -> this bucket's handles from its host

    def replace_engine(self, engine) -> None:
        """The owner's engine was restarted (EngineRestarts.restart_engine): later loads go to `engine`, whose
        layout is checked again at its first sync. The staging buffers are the hosts' and stay."""
        _check_engine_args(engine)
        self.engine = engine
        self._engine_checked = False

    @property
    def last_engine_reports(self) -> list[dict] | None:
        """Owner with verify: each engine rank's probe report after the last sync (engine_side.probe)."""
        return None if self._verifier is None else self._verifier.last_reports

    @classmethod
    def for_megatron_worker(
        cls,
        worker,
        placement,
        sync_cfg,
        *,
        engine=None,
        engine_dtype: str = "float32",
        mode: str = "auto",
        **kwargs,
    ) -> "WeightResharder":
        """The resharder for a MegatronWorker's model (every rank of the placement calls this or, on a rank
        without the worker, for_rollout_rank)."""
        plan = plan_weight_sync(
            worker.spec,
            worker.checkpoint.config,
            worker.layout,
            placement,
            bucket_bytes=int(sync_cfg.bucket_mb * 2**20),
            element_size=torch_dtype(engine_dtype).itemsize,
            mode=mode,
            padded_vocab=worker.chunks[0].vocab_size,
            engine_device=worker.device.type,
        )
        return cls(
            plan,
            megatron_tensors(worker.chunks, worker.config),
            engine=engine,
            engine_dtype=torch_dtype(engine_dtype),
            verify=sync_cfg.verify,
            transport=sync_cfg.transport,
            **kwargs,
        )

    @classmethod
    def for_rollout_rank(
        cls,
        model_path: str,
        layout,
        placement,
        sync_cfg,
        *,
        engine=None,
        engine_dtype: str = "float32",
        engine_device: str = "cpu",
        mode: str = "auto",
        **kwargs,
    ) -> "WeightResharder":
        """The resharder on a rank that hosts engines and trains nothing (disaggregated placement): the same
        plan as the training ranks' (Megatron's default vocabulary padding, as the worker builds it), no
        tensors of its own to send."""
        config = HFCheckpoint(model_path).config
        plan = plan_weight_sync(
            spec_for(config),
            config,
            layout,
            placement,
            bucket_bytes=int(sync_cfg.bucket_mb * 2**20),
            element_size=torch_dtype(engine_dtype).itemsize,
            mode=mode,
            engine_device=engine_device,
        )
        return cls(
            plan,
            {},
            engine=engine,
            engine_dtype=torch_dtype(engine_dtype),
            verify=sync_cfg.verify,
            transport=sync_cfg.transport,
            **kwargs,
        )

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
        sent, group_sent_before = 0, self.group_transport.sent_bytes
        expected: dict = {}  # (engine, rank, name) -> checksum shares
        # A local failure skips this rank's remaining steps and is reported at the next exchange (before any load).
        errors = RankErrors(
            f"weight sync to version {version}", on_failure=self._abort if self.engine is not None else None
        )
        with file_system_sharing():
            if not self._ready:  # first sync (or after a failed one): staging buffers and their handles
                hostnames = errors.exchange(socket.gethostname())
                errors.run(self.group_transport.set_hostnames, hostnames)
                hosted = errors.run(lambda: self.staging.allocate(self._readers()))
                errors.run(self.staging.open, errors.exchange(hosted), hostnames)
            clock = _PhaseClock()
            for b in range(len(self.plan.buckets)):
                with clock("write"):
                    shares, n = errors.run(self._write_bucket, b, default=(None, 0))
                    handles = errors.run(self.staging.hosted_handles, b)
                sent += n
                self._bucket_handles = {}
                with clock("exchange"):
                    exchanged = errors.exchange((shares, handles))
                for status, hosted in exchanged:
                    for key, value in (status or {}).items():
                        expected.setdefault(key, []).append(value)
                    self._bucket_handles.update(hosted or {})
                for transport in self._transports:
                    if transport.delivers(b):  # every rank staged its pieces: now they travel
                        with clock("deliver"):
                            delivered = errors.run(transport.deliver, b)
                        with clock("exchange"):
                            exchanged = errors.exchange(delivered)
                        for status in exchanged:
                            for key, value in (status or {}).items():
                                expected.setdefault(key, []).append(value)
                self._ready = True
                if self.engine is not None:
                    # The update begins once the first bucket is here (every rank has staged it): until then
                    # the engine goes on generating what it has in flight (partial rollouts).
                    if b == 0:
                        with clock("engine_begin"):
                            errors.run(self._begin, version)
                    with clock("engine_load"):
                        errors.run(self._load_bucket, b)
            if self.engine is not None:
                with clock("engine_finish"):
                    errors.run(self._finish, expected)
            statuses = errors.exchange(
                {
                    "seconds": time.perf_counter() - tic,
                    "sent": sent,
                    "group_sent": self.group_transport.sent_bytes - group_sent_before,
                    "phases": dict(clock.seconds),
                }
            )
        self.version = version
        if self.engine is not None:
            state_of(self.engine).complete_update(version)
        seconds = max(s["seconds"] for s in statuses)
        busiest = max(range(len(statuses)), key=lambda r: statuses[r]["sent"])
        receivers = {
            (e, r): self.plan.receiver_bytes(e, r)
            for e in range(len(self.plan.engines))
            for r in range(self.plan.engine_tp)
        }
        return SyncStats(
            version=version,
            seconds=seconds,
            total_bytes=self.plan.total_bytes,
            busiest_sender_bytes=statuses[busiest]["sent"],
            busiest_sender=busiest,
            buckets=len(self.plan.buckets),
            receiver_bytes=receivers,
            verified=self.verify,
            group_bytes=sum(s["group_sent"] for s in statuses),
            phases={
                phase: max(s["phases"].get(phase, 0.0) for s in statuses)
                for phase in PHASES
                if any(phase in s["phases"] for s in statuses)
            },
        )

    def release_staging(self) -> None:
        """Collective (every rank, between syncs): frees this rank's staging buffers (two of the largest bucket
        per hosted engine rank) while they are not needed, e.g. while training runs; the next sync allocates
        them again and exchanges their handles, as the first one does."""
        self.staging.release()
        self._bucket_handles = {}
        self._ready = False

    # ---- steps --------------------------------------------------------------------------------------------

    @property
    def _transports(self):
        return (self.shared_memory, self.group_transport)

    def _transport_to(self, host: int):
        """The transport that carries this rank's pieces for engine ranks staged on `host`."""
        return self.group_transport if self.group_transport.via_group(self.rank, host) else self.shared_memory

    def _readers(self) -> dict:
        """(engine, engine rank) -> the ranks other than its host that write into its staging buffers through
        shared memory, and so open them (the same on every rank once the host names are known). Owners load
        through handles their hosts make per bucket (StagingBuffers.hosted_handles)."""
        readers: dict = {}
        for b in range(len(self.plan.buckets)):
            for e, ranks in enumerate(self.plan.engines):
                for rp in ranks:
                    for target in self.plan.bucket_targets(b, e, rp.rank):
                        for piece in target.pieces:
                            if piece.src_rank != rp.host and not self.group_transport.via_group(
                                piece.src_rank, rp.host
                            ):
                                readers.setdefault((e, rp.rank), set()).add(piece.src_rank)
        return readers

    def _begin(self, version: int):
        # First: SGLang holds every call that touches the weights (the probes too) until no request is in flight.
        state_of(self.engine).begin_update(f"weight sync to version {version} in progress")
        if not self._engine_checked:
            self._verifier.check_layout()
            self._engine_checked = True
        elif self.load_format == engine_side.LOAD_COUNTED:
            self.probe_engine(checksums=False)  # zero the engine ranks' received-bytes counters
        self._call("begin_weight_update", "begin_weight_update")

    def _write_bucket(self, b: int):
        """Stages this rank's pieces of bucket b through the transport that reaches each piece's host; returns
        (checksum shares of what it wrote, bytes it sends)."""
        if self.on_bucket is not None:
            self.on_bucket(b)
        sent = 0
        self.staging.zero_padding(b, self._zero_fills.get(b, ()))
        routed = {transport: [] for transport in self._transports}
        for e, r, target, offset, piece in self._writes.get(b, ()):
            src = narrow(self.local[piece.src_name], piece.src)
            routed[self._transport_to(self.plan.engines[e][r].host)].append(
                (e, r, target, offset, piece, src)
            )
            sent += piece.numel * self.plan.element_size
        shares = {}
        with torch.no_grad():
            for transport, items in routed.items():
                shares.update(transport.stage(b, items))
        return shares, sent

    def _load_bucket(self, b: int):
        from sglang.srt.model_executor.model_runner_components.weight_updater import LocalSerializedTensor
        from sglang.srt.utils import MultiprocessingSerializer

        e = self.engine_index
        ranks = self.plan.engines[e]
        views = {rp.rank: self.staging.views(b, e, rp) for rp in ranks if rp.host == self.rank}
        named = []
        for j, name in enumerate(self.plan.buckets[b]):
            values = []
            for rp in ranks:
                if rp.host == self.rank:
                    view = views[rp.rank][j]
                    values.append(MultiprocessingSerializer.serialize(view))
                else:  # made by its host (StagingBuffers.hosted_handles)
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
        self._call(
            f"load of bucket {b}",
            "update_weights_from_tensor",
            named,
            load_format=load_format,
            flush_cache=b == len(self.plan.buckets) - 1,
        )

    def _finish(self, expected: dict):
        self._call("end_weight_update", "end_weight_update")
        if self.verify:
            self._verifier.verify(expected)
        elif self._counted_loads:
            # The counted loader records what it could not load (raising would kill the scheduler): report it.
            self._verifier.raise_load_errors(self.probe_engine(checksums=False))

    @cached_property
    def _counted_loads(self) -> bool:
        """Whether this engine's loads go through engine_side.load_counted (always for split parameters)."""
        return not self.plan.shared and (
            self.load_format == engine_side.LOAD_COUNTED or bool(self.plan.row_range_buckets)
        )

    def _abort(self, reason: str):
        """After a failure: the engine stays stale; close its weight-update session unless it is dead."""
        state = state_of(self.engine)
        if state.stale_reason is not None:
            state.stale_reason = reason
        if not engine_health.is_dead(self.engine):
            with contextlib.suppress(Exception):
                self.engine.end_weight_update()

    def probe_engine(self, checksums: bool) -> list[dict]:
        """Owner only: every engine rank's report (engine_side.probe): parameters, received bytes, errors."""
        return self._verifier.probe(checksums)

    # ---- bookkeeping ------------------------------------------------------------------------------------

    def _index_writes(self) -> dict:
        """bucket -> [(engine, rank, target, offset in the staging buffer, piece)] this rank writes."""
        writes, self._zero_fills = planned_writes(self.plan, self.rank)
        return writes

    def _check_local_tensors(self):
        for b, items in self._writes.items():
            for _, _, _, _, piece in items:
                tensor = self.local.get(piece.src_name)
                if tensor is None:
                    raise ValueError(
                        f"rank {self.rank} holds no Megatron parameter {piece.src_name!r} that the weight "
                        "plan reads from it (the plan assumes Megatron's even layer split over stages)"
                    )
                if any(s + n > size for (s, n), size in zip(piece.src, tensor.shape)):
                    raise ValueError(
                        f"rank {self.rank}: {piece.src_name} has shape {tuple(tensor.shape)}, the plan "
                        f"reads {piece.src}"
                    )

    def _device(self) -> torch.device:
        if self.local:
            return next(iter(self.local.values())).device
        # A rollout-only rank stages on its engine's device.
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )

    def _call(self, what: str, method: str, *args, **kwargs):
        """Calls engine.<method>; raises on SGLang's (False, message) answers, and EngineDiedError (with the
        engine log's tail) on a dead engine, within about a second of the death (engine_health)."""
        result = engine_health.call(
            self.engine, f"{what} of the weight sync", getattr(self.engine, method), *args, **kwargs
        )
        ok, message = (result[0], result[1]) if isinstance(result, tuple) else (result is not False, "")
        if not ok:
            raise RuntimeError(f"engine {what} failed: {message}")
        return result


def _check_engine_args(engine) -> None:
    loaders = list(getattr(getattr(engine, "server_args", None), "custom_weight_loader", None) or [])
    missing = [n for n in engine_side.engine_args()["custom_weight_loader"] if n not in loaders]
    if missing:
        raise ValueError(
            f"the engine was started without the weight-sync loaders {missing}; start it with "
            "extra_args=distflow.coordination.weights.engine_side.engine_args()"
        )


def planned_writes(plan: WeightSyncPlan, rank: int) -> tuple[dict, dict]:
    """What `rank` does to the staging buffers in each sync: (bucket -> [(engine, engine rank, target, offset
    in the staging buffer, piece)] it writes, bucket -> [(engine, engine rank, target, offset)] of the padded
    targets it hosts and zeroes first)."""
    writes, zero = {}, {}
    for b in range(len(plan.buckets)):
        for e, ranks in enumerate(plan.engines):
            for rp in ranks:
                offset = 0
                for target in plan.bucket_targets(b, e, rp.rank):
                    if target.padding_rows and rp.host == rank:
                        zero.setdefault(b, []).append((e, rp.rank, target, offset))
                    for piece in target.pieces:
                        if piece.src_rank == rank:
                            writes.setdefault(b, []).append((e, rp.rank, target, offset, piece))
                    offset += target.numel
    return writes, zero
