"""The weight-sync plan: for every tensor every engine TP rank receives, which training rank sends which
region of which Megatron shard, grouped into size-bounded buckets. A pure function of (training layout,
placement, family spec + HF config), computed identically on every rank and tested without processes.

Two target kinds:
- "shards" (families in sglang_layout.SHARD_FAMILIES, dense and MoE): each engine rank receives its own SGLang
  parameters, exactly its slice, loaded with SGLang's load_format="direct" (MoE: the fused expert tensors
  w13/w2 of the rank's FFN slice of every expert, assembled from the experts' EP owners);
- "hf" (fallback: families without a shard layout, models SGLang's CPU engine pads, or mode "hf"): each
  engine receives full HF-named tensors once (all its ranks read the same buffer) and SGLang's own loader
  shards them.
Senders: engine e reads from data-parallel replica e % (dp * cp) of the trained model (routed experts:
expert-DP replica e % edp, from the expert-parallel rank that owns the expert), so engines are fed by
different replicas where there are several; a tensor every TP rank holds (norms) is sent by the engine
rank's own host when that rank holds it, else by the least-loaded TP rank. Tensors are ordered so that
each bucket draws on every pipeline stage in proportion to its bytes (the stages write in parallel). A
parameter larger than the bound is sent as row ranges (split_rows), so every bucket stays within it (HF
fallback: SGLang's loader takes whole tensors, so a larger one gets a bucket of its own).
"""

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

from distflow.coordination.weights import sglang_layout
from distflow.coordination.weights.megatron_layout import (
    TrainedModelLayout,
    expert_data_parallel_size,
    expert_rank,
)
from distflow.coordination.weights.regions import Region, full_region, volume
from distflow.layout import ParallelLayout, Placement

SHARDS, HF = "shards", "hf"


@dataclass(frozen=True)
class Piece:
    """Global rank `src_rank` copies region `src` of its local Megatron tensor `src_name` into region `dst`
    of the target tensor."""

    src_rank: int
    src_name: str
    src: Region
    dst: Region

    @property
    def numel(self) -> int:
        return volume(self.dst)


@dataclass(frozen=True)
class Target:
    """One tensor an engine rank receives; regions no piece covers are zero (vocabulary padding).

    A parameter larger than the bucket bound travels as several targets, each rows [row_offset, row_offset +
    shape[0]) of engine parameter `param` (named `param[a:b]`), so that no bucket exceeds the bound."""

    name: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    stage: int
    param: str | None = None
    """The engine parameter this target is rows of (None: the whole parameter `name`)."""
    row_offset: int = 0
    param_rows: int | None = None

    @property
    def numel(self) -> int:
        return volume(full_region(self.shape))

    @property
    def param_name(self) -> str:
        return self.param or self.name

    @property
    def param_shape(self) -> tuple[int, ...]:
        return self.shape if self.param_rows is None else (self.param_rows,) + tuple(self.shape[1:])

    def in_param(self, region: Region) -> Region:
        """A region of this target as a region of its engine parameter (for checksums of the whole)."""
        return ((region[0][0] + self.row_offset, region[0][1]),) + tuple(region[1:])

    @property
    def padding_rows(self) -> tuple[int, int] | None:
        """(first row, count) that no piece covers and must be zero (vocabulary padding), or None."""
        covered = sum(p.numel for p in self.pieces)
        if covered == self.numel:
            return None
        row = self.numel // self.shape[0]
        first = max((p.dst[0][0] + p.dst[0][1] for p in self.pieces), default=0)
        assert covered == first * row, f"{self.name}: pieces leave gaps other than trailing rows"
        return first, self.shape[0] - first


@dataclass(frozen=True)
class EngineRankPlan:
    """What engine TP rank `rank` of engine `engine` receives; `host` is the global rank on whose device it
    runs, which stages its buffers. With shared=True (HF fallback) every rank of the engine reads this
    rank-0 plan's buffers."""

    engine: int
    rank: int
    host: int
    targets: tuple[Target, ...]

    @cached_property
    def by_name(self) -> dict[str, Target]:
        return {t.name: t for t in self.targets}

    @cached_property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Engine parameter -> its shape (a parameter split into row ranges appears once)."""
        return {t.param_name: t.param_shape for t in self.targets}


@dataclass(frozen=True)
class WeightSyncPlan:
    mode: str
    """SHARDS or HF."""
    engine_tp: int
    engines: tuple[tuple[EngineRankPlan, ...], ...]
    """[engine][rank] (HF mode: one shared plan per engine)."""
    owners: tuple[int, ...]
    """Global rank that owns each engine's sglang.Engine object (its first rank)."""
    buckets: tuple[tuple[str, ...], ...]
    """Target names per bucket, in sync order (the same names on every engine rank)."""
    element_size: int

    @property
    def shared(self) -> bool:
        return self.mode == HF

    @cached_property
    def row_range_buckets(self) -> frozenset[int]:
        """Buckets holding row ranges of a parameter larger than the bound (the same names on every rank)."""
        first = self.engines[0][0].by_name if self.engines else {}
        return frozenset(
            b for b, names in enumerate(self.buckets) if any(first[n].param is not None for n in names)
        )

    def ranks_of(self, engine: int) -> tuple[EngineRankPlan, ...]:
        return self.engines[engine]

    def receiver_bytes(self, engine: int, rank: int) -> int:
        """Bytes engine TP rank `rank` receives per sync (HF mode: the full model)."""
        plan = self.engines[engine][0 if self.shared else rank]
        return sum(t.numel for t in plan.targets) * self.element_size

    def sender_bytes(self) -> dict[int, int]:
        """Bytes each global rank copies out of its shards per sync."""
        out = defaultdict(int)
        for ranks in self.engines:
            for plan in ranks:
                for t in plan.targets:
                    for p in t.pieces:
                        out[p.src_rank] += p.numel * self.element_size
        return dict(out)

    @property
    def total_bytes(self) -> int:
        """Bytes delivered into all engines per sync (HF mode: one full copy per engine)."""
        return sum(
            self.receiver_bytes(e, r)
            for e in range(len(self.engines))
            for r in range(1 if self.shared else self.engine_tp)
        )

    def bucket_targets(self, bucket: int, engine: int, rank: int) -> list[Target]:
        by_name = self.engines[engine][rank].by_name
        return [by_name[n] for n in self.buckets[bucket]]

    def describe(self) -> str:
        send = self.sender_bytes()
        lines = [
            f"weight sync ({self.mode}): {len(self.engines)} engine(s) x TP {self.engine_tp}, "
            f"{len(self.buckets)} bucket(s), {self.total_bytes / 2**20:.1f} MiB per sync"
        ]
        for e, ranks in enumerate(self.engines):
            for plan in ranks:
                lines.append(
                    f"  engine {e} rank {plan.rank} (host {plan.host}): {len(plan.targets)} tensors, "
                    f"{self.receiver_bytes(e, plan.rank) / 2**20:.2f} MiB"
                )
        lines += [f"  rank {r} sends {b / 2**20:.2f} MiB" for r, b in sorted(send.items())]
        return "\n".join(lines)


def sync_mode(
    spec, requested: str = "auto", hf_config=None, engine_tp: int = 1, engine_device: str = "cuda"
) -> str:
    """ "auto" picks SHARDS for families with an SGLang shard layout, else the HF fallback; also the fallback
    where SGLang's CPU engine pads the model (sglang_layout.cpu_engine_pads)."""
    if requested == "auto":
        if not spec.sglang_shards:
            return HF
        if (
            engine_device == "cpu"
            and hf_config is not None
            and sglang_layout.cpu_engine_pads(hf_config, engine_tp)
        ):
            return HF
        return SHARDS
    if requested not in (SHARDS, HF):
        raise ValueError(f"weight sync mode {requested!r}: one of 'auto', {SHARDS!r}, {HF!r}")
    if requested == SHARDS and not spec.sglang_shards:
        raise ValueError(
            f"{spec.family}: no SGLang shard layout (families with one: "
            f"{sglang_layout.SHARD_FAMILIES}); use mode 'hf'"
        )
    return requested


def plan_weight_sync(
    spec,
    hf_config,
    train: ParallelLayout,
    placement: Placement,
    *,
    bucket_bytes: int,
    element_size: int = 2,
    mode: str = "auto",
    padded_vocab: int | None = None,
    hf_shapes: dict[str, tuple] | None = None,
    engine_device: str = "cuda",
) -> WeightSyncPlan:
    """The plan for pushing the model trained in `train` (over placement.train_ranks) into every engine of
    `placement`. element_size: bytes per element in the engine's dtype; bucket_bytes bounds what one
    engine rank receives per bucket; padded_vocab: Megatron's vocabulary rows (default: its padding rule);
    engine_device: "cpu" or "cuda" (SGLang's CPU engine pads some models, see sync_mode)."""
    if len(placement.train_ranks) != train.world_size:
        raise ValueError(
            f"the training layout covers {train.world_size} ranks but the placement trains on "
            f"{len(placement.train_ranks)}"
        )
    assert bucket_bytes > 0 and element_size > 0
    mode = sync_mode(spec, mode, hf_config, placement.engine_tp, engine_device)
    model = TrainedModelLayout(spec, hf_config, train, padded_vocab, hf_shapes)
    replicas = train.dp * train.cp
    engine_tp = placement.engine_tp
    load: dict[int, int] = defaultdict(int)  # elements each rank sends, for choosing among replicated holders
    engines = []
    for e in range(placement.num_engines):
        replica = e % replicas
        cp, dp = replica % train.cp, replica // train.cp
        hosts = placement.engine_ranks(e)
        edp = e % expert_data_parallel_size(train)

        def holders_of(part) -> list[int]:
            """Global ranks of this engine's replica that hold `part` (several when TP ranks replicate it)."""
            if part.ep_rank is None:
                local = [
                    train.rank(tp=t, cp=cp, dp=dp, pp=part.stage)
                    for t in (range(train.tp) if part.tp_rank is None else [part.tp_rank])
                ]
            else:
                local = [
                    expert_rank(train, part.stage, part.ep_rank, t, edp)
                    for t in (range(train.etp) if part.tp_rank is None else [part.tp_rank])
                ]
            return [placement.train_ranks[i] for i in local]

        ranks = []
        for r in range(1 if mode == HF else engine_tp):
            specs = (
                sglang_layout.hf_full_targets(spec, hf_config, hf_shapes)
                if mode == HF
                else sglang_layout.sglang_shard_targets(spec, hf_config, engine_tp, r)
            )
            targets = []
            for ts in specs:
                pieces, stage = [], None
                for seg in ts.segments:
                    for part in model.parts(seg.hf_name, seg.src):
                        stage = part.stage
                        holders = holders_of(part)
                        src = hosts[r] if hosts[r] in holders else min(holders, key=lambda h: (load[h], h))
                        dst = _place(seg, part)
                        piece = Piece(src, part.name, part.src, dst)
                        load[src] += piece.numel
                        pieces.append(piece)
                whole = Target(ts.name, ts.shape, tuple(pieces), stage if stage is not None else 0)
                targets += [whole] if mode == HF else split_rows(whole, bucket_bytes // element_size)
            ranks.append(EngineRankPlan(engine=e, rank=r, host=hosts[r], targets=tuple(targets)))
        engines.append(tuple(ranks))
    owners = tuple(placement.engine_ranks(e)[0] for e in range(placement.num_engines))
    buckets = _buckets(engines, bucket_bytes, element_size, train.pp) if engines else ()
    return WeightSyncPlan(
        mode=mode,
        engine_tp=engine_tp,
        engines=tuple(engines),
        owners=owners,
        buckets=buckets,
        element_size=element_size,
    )


def _place(seg, part) -> tuple:
    """Where a Megatron part of segment `seg` lands in the target. A destination with more dimensions than
    the HF source (one expert in a stacked expert tensor) keeps its leading ones as they are."""
    lead = len(seg.dst) - len(seg.src)
    assert lead >= 0 and all(n == 1 for _, n in seg.dst[:lead]), (
        f"{seg}: destination does not embed the source"
    )
    return seg.dst[:lead] + tuple(
        (d0 + o, n) for (d0, _), o, n in zip(seg.dst[lead:], part.offset, part.extent)
    )


def split_rows(target: Target, max_numel: int) -> list[Target]:
    """`target` as consecutive row ranges of at most max_numel elements each (at least one row: a single row
    larger than the bound travels alone). Each piece is cut at the range's edges; the names depend only on
    the shape, so they are the same on every engine rank."""
    row = target.numel // target.shape[0] if target.shape and target.shape[0] else 0
    if target.numel <= max_numel or row == 0:
        return [target]
    per = max(1, max_numel // row)
    rows = target.shape[0]
    out = []
    for first in range(0, rows, per):
        n = min(per, rows - first)
        pieces = tuple(cut for p in target.pieces if (cut := _cut_rows(p, first, n)) is not None)
        out.append(
            Target(
                f"{target.name}[{first}:{first + n}]",
                (n,) + tuple(target.shape[1:]),
                pieces,
                target.stage,
                param=target.name,
                row_offset=first,
                param_rows=rows,
            )
        )
    return out


def _cut_rows(piece: Piece, first: int, n: int) -> Piece | None:
    """The part of `piece` that lands in target rows [first, first + n), placed relative to `first`; None if
    none does. Where the destination has a leading dimension the source lacks (one expert of a stacked
    tensor), the piece is one row and lies wholly inside or outside."""
    (d0, dn), rest = piece.dst[0], piece.dst[1:]
    lo, hi = max(first, d0), min(first + n, d0 + dn)
    if lo >= hi:
        return None
    src = piece.src
    if len(piece.dst) == len(src):  # target rows are source rows
        (s0, _), src_rest = src[0], src[1:]
        src = ((s0 + lo - d0, hi - lo),) + src_rest
    else:
        assert dn == 1, f"{piece}: a leading destination dimension of more than one row"
    return Piece(piece.src_rank, piece.src_name, src, ((lo - first, hi - lo),) + rest)


def _buckets(engines, bucket_bytes: int, element_size: int, stages: int) -> tuple[tuple[str, ...], ...]:
    """Target names in buckets whose bytes per engine rank stay within bucket_bytes, each bucket drawing on
    every pipeline stage in proportion to its share (the next name comes from the stage that is furthest
    behind in bytes)."""
    size = defaultdict(int)  # name -> largest bytes on any engine rank
    stage_of = {}
    for ranks in engines:
        for plan in ranks:
            for t in plan.targets:
                size[t.name] = max(size[t.name], t.numel * element_size)
                stage_of[t.name] = t.stage
    order = [t.name for t in engines[0][0].targets]
    for ranks in engines:
        for plan in ranks:
            if [t.name for t in plan.targets] != order:
                raise ValueError(
                    f"engine {plan.engine} rank {plan.rank} receives other tensors than engine 0 rank 0 "
                    "(its parameters' shapes differ): one bucket order cannot serve both"
                )
    queues = {s: [n for n in order if stage_of[n] == s] for s in range(stages)}
    totals = {s: sum(size[n] for n in q) or 1 for s, q in queues.items()}
    done = {s: 0 for s in queues}
    interleaved = []
    while any(queues.values()):
        s = min((s for s in queues if queues[s]), key=lambda s: (done[s] / totals[s], s))
        name = queues[s].pop(0)
        done[s] += size[name]
        interleaved.append(name)
    buckets, current, current_bytes = [], [], 0
    for name in interleaved:
        if current and current_bytes + size[name] > bucket_bytes:
            buckets.append(tuple(current))
            current, current_bytes = [], 0
        current.append(name)
        current_bytes += size[name]
    if current:
        buckets.append(tuple(current))
    return tuple(buckets)
