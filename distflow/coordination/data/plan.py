"""The data plan: which sample goes from which rank to which ranks, as a pure function of (producer
layout, consumer layout, per-sample metadata). Every rank computes it from the same all-gathered
SampleTable and gets the same answer, so no rank decides for the others and nothing else is exchanged.

Rules: a sample's holder sends it; it goes to every TP and CP rank of the consumer DP group it is
assigned to, field by field to the pipeline stages that use the field (FieldPlacement). A holder that is
itself one of those ranks keeps its copy (zero bytes). Same layout on the same ranks, with the data
already on every rank that needs it: nothing moves at all. Consumer DP groups are balanced by tokens,
moving as few tokens as balance allows (balance.balanced_assignment).
"""

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, Optional

import numpy as np

from distflow.batch.packed import FieldSchema, PackedBatch
from distflow.coordination.data import balance
from distflow.coordination.data.layouts import FieldPlacement, PlacedLayout
from distflow.coordination.data.stream_placement import StreamPlacement


class DataPlanError(ValueError):
    """Metadata that does not fit the plan; the message names the node, the offending key and rank."""

    def __init__(self, node: str, message: str, key=None, rank: Optional[int] = None):
        super().__init__(f"node {node!r}: {message}")
        self.node, self.key, self.rank = node, key, rank


@dataclass
class SampleTable:
    """Per-sample metadata of a whole batch, gathered from every rank (int64 arrays, one entry a sample)."""

    sample_ids: np.ndarray
    groups: np.ndarray
    lengths: np.ndarray
    holders: np.ndarray
    rows: dict[str, np.ndarray] = field(default_factory=dict)  # ragged field -> rows per sample (-1: absent)
    schemas: dict[int, dict[str, FieldSchema]] = field(default_factory=dict)  # per rank that gave a batch

    @classmethod
    def from_batches(cls, batches: Mapping[int, Optional[PackedBatch]]) -> "SampleTable":
        """The table of {holder rank: its batch} (what the all-gather assembles on every rank)."""
        present = {r: b for r, b in sorted(batches.items()) if b is not None}
        ragged = sorted({n for b in present.values() for n in b.row_counts})

        def cat(parts):
            return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

        rows = {
            n: cat(
                [
                    b.row_counts[n].numpy() if n in b.row_counts else np.full(len(b), -1)
                    for b in present.values()
                ]
            )
            for n in ragged
        }
        return cls(
            cat([b.sample_ids.numpy() for b in present.values()]),
            cat([b.groups.numpy() for b in present.values()]),
            cat([b.lengths.numpy() for b in present.values()]),
            cat([np.full(len(b), r) for r, b in present.items()]),
            rows,
            {r: b.schema() for r, b in present.items()},
        )

    def __len__(self) -> int:
        return len(self.sample_ids)

    def take(self, order: np.ndarray) -> "SampleTable":
        return SampleTable(
            self.sample_ids[order],
            self.groups[order],
            self.lengths[order],
            self.holders[order],
            {n: r[order] for n, r in self.rows.items()},
            self.schemas,
        )


@dataclass(frozen=True)
class Segment:
    """One field of a transfer: its rows (token rows for a ragged field, samples for a fixed one)."""

    field: str
    rows: int
    nbytes: int


@dataclass(frozen=True)
class Transfer:
    """The samples (positions in the plan's table, ascending sample id) and fields src sends to dst.
    Each field with rows travels as one contiguous message, sized from the plan on both sides."""

    src: int
    dst: int
    positions: np.ndarray
    segments: tuple[Segment, ...]

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(s.field for s in self.segments)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)


class RedistributionPlan:
    """Built by plan_redistribution. Positions index `table`, which is sorted by sample id."""

    def __init__(self, node, producer, consumer, fields, schema, table, assignment, identity, keep_groups):
        self.node, self.producer, self.consumer, self.fields = node, producer, consumer, fields
        self.schema: dict[str, FieldSchema] = schema
        self.table: Optional[SampleTable] = table
        self.assignment: np.ndarray = assignment  # consumer DP rank per sample
        self.identity, self.keep_groups = identity, keep_groups

    # --- who needs what ---------------------------------------------------------------------------
    def consumer_positions(self, rank: int) -> np.ndarray:
        """The samples `rank` ends up with (empty for a rank outside the consumer layout)."""
        d = self.consumer.dp_of(rank)
        return np.zeros(0, dtype=np.int64) if d is None or self.identity else self._by_dp[d]

    def consumer_fields(self, rank: int) -> tuple[str, ...]:
        stage = self.consumer.stage_of(rank)
        return () if stage is None else self.fields.fields_for_stage(stage, self.consumer.layout.pp)

    def kept(self, rank: int) -> np.ndarray:
        """Samples `rank` both holds and consumes: they do not move."""
        return self._routes[1].get(rank, np.zeros(0, dtype=np.int64))

    def sends(self, rank: int) -> list[Transfer]:
        return [t for (s, _), t in sorted(self._routes[0].items()) if s == rank]

    def receives(self, rank: int) -> list[Transfer]:
        return [t for (_, d), t in sorted(self._routes[0].items(), key=lambda kv: kv[0][::-1]) if d == rank]

    @property
    def transfers(self) -> list[Transfer]:
        return [t for _, t in sorted(self._routes[0].items())]

    # --- sizes ---------------------------------------------------------------------------------------
    def field_rows(self, name: str, positions: np.ndarray) -> np.ndarray:
        return (
            self.table.rows[name][positions]
            if self.schema[name].ragged
            else np.ones(len(positions), np.int64)
        )

    def segments(self, positions: np.ndarray, fields) -> list[Segment]:
        """Rows and bytes of each of `fields` for the samples at `positions`."""
        rows = [int(self.field_rows(name, positions).sum()) for name in fields]
        return [Segment(name, n, n * self.schema[name].row_bytes) for name, n in zip(fields, rows)]

    def bytes_sent(self, rank: int) -> int:
        return sum(t.nbytes for t in self.sends(rank))

    def bytes_received(self, rank: int) -> int:
        return sum(t.nbytes for t in self.receives(rank))

    @property
    def moved_bytes(self) -> int:
        return sum(t.nbytes for t in self._routes[0].values())

    # --- balance -------------------------------------------------------------------------------------
    def dp_tokens(self) -> np.ndarray:
        """Tokens per consumer DP rank."""
        return balance.loads_of(self.table.lengths, self.assignment, self.consumer.layout.dp).astype(np.int64)

    def imbalance(self) -> float:
        return balance.imbalance(self.dp_tokens())

    def micro_batches(
        self, rank: int, count: Optional[int] = None, max_tokens: Optional[int] = None
    ) -> list[np.ndarray]:
        """Token-balanced micro-batches of `rank`'s samples, as positions into its consumer batch (sorted by
        sample id). The number of micro-batches is the same on every DP rank (pipeline schedules need it):
        the fewest, at least `count`, that keep every DP rank's micro-batches within max_tokens."""
        dp = self.consumer.layout.dp
        lengths = [self.table.lengths[self._by_dp[d]] for d in range(dp)]
        agreed = (
            max(len(balance.micro_batches(rows, count, max_tokens)) for rows in lengths) if lengths else 1
        )
        while True:
            per_dp = [balance.micro_batches(rows, agreed, max_tokens) for rows in lengths]
            if all(len(b) == agreed for b in per_dp):
                break
            agreed = max(len(b) for b in per_dp)
        d = self.consumer.dp_of(rank)
        return [] if d is None else per_dp[d]

    def summary(self) -> str:
        if self.identity:
            return f"node {self.node!r}: same layout ({self.consumer.describe()}), nothing moves"
        tokens = self.dp_tokens()
        return (
            f"node {self.node!r}: {len(self.table)} samples {self.producer.describe()} -> "
            f"{self.consumer.describe()}: {len(self._routes[0])} transfers, {self.moved_bytes / 2**20:.1f} MiB "
            f"moved, tokens per DP rank {tokens.min()}..{tokens.max()} (max/mean {self.imbalance():.4f})"
        )

    # --- internals -----------------------------------------------------------------------------------
    @cached_property
    def _by_dp(self) -> list[np.ndarray]:
        return [np.flatnonzero(self.assignment == d) for d in range(self.consumer.layout.dp)]

    @cached_property
    def _routes(self) -> tuple[dict, dict]:
        transfers, kept = {}, {}
        if self.identity:
            return transfers, kept
        pp = self.consumer.layout.pp
        for d, positions in enumerate(self._by_dp):
            holders = self.table.holders[positions]
            sources = np.unique(holders)
            for rank in self.consumer.dp_ranks(d):
                names = tuple(
                    n
                    for n in self.fields.fields_for_stage(self.consumer.stage_of(rank), pp)
                    if n in self.schema
                )
                if not names:
                    continue
                for src in sources.tolist():
                    mine = positions[holders == src]
                    if src == rank:
                        kept[rank] = mine
                    else:
                        transfers[(src, rank)] = Transfer(src, rank, mine, tuple(self.segments(mine, names)))
        return transfers, kept


def is_identity(producer: PlacedLayout, consumer: PlacedLayout) -> bool:
    """Same layout on the same ranks, and every rank already has what its stage needs: nothing moves."""
    L = producer.layout
    return producer.same_ranks_as(consumer) and (producer.replicated or L.tp * L.cp * L.pp == 1)


def plan_redistribution(
    producer: PlacedLayout,
    consumer: PlacedLayout,
    table: Optional[SampleTable],
    fields: FieldPlacement,
    *,
    keep_groups: bool = True,
    tolerance: float = 0.01,
    node: str = "?",
    equal_rows: Optional[bool] = None,
    placement: Optional[StreamPlacement] = None,
) -> RedistributionPlan:
    """Plans moving a node's data from the producer layout to the consumer layout.

    table: every holder's per-sample metadata (None is allowed only when is_identity). keep_groups: a
    prompt's group goes whole to one consumer DP rank (and must be produced whole on one holder).
    tolerance: accepted token imbalance (max/mean - 1) across consumer DP ranks, traded for fewer moves.
    equal_rows: every consumer DP rank gets the same number of samples (default: for training layouts,
    whose DP ranks step their optimizers together; see balance.equal_count_assignment).
    placement: the batch moves in parts (stream_placement.py): items keep the DP rank an earlier part
    gave them and new ones are placed the same way; with equal_rows, a placement that leaves the DP ranks
    unequal gives way to the usual balanced plan.
    Raises DataPlanError for metadata that does not fit.
    """
    equal_rows = consumer.replicated if equal_rows is None else equal_rows
    if placement is not None and placement.keep_groups != keep_groups:
        placement = None  # its keys are groups and this plan's samples, or the reverse
    if is_identity(producer, consumer) and not (equal_rows and _unequal_rows(table, consumer)):
        return RedistributionPlan(
            node, producer, consumer, fields, {}, None, np.zeros(0, np.int64), True, keep_groups
        )
    if table is None:
        raise DataPlanError(
            node,
            f"layouts differ ({producer.describe()} -> {consumer.describe()}) but no "
            "sample metadata was given",
        )
    schema = _check_table(table, producer, fields, node)
    table = table.take(np.argsort(table.sample_ids, kind="stable"))
    items, keys, weights, homes = _items(table, consumer, keep_groups, node)
    if equal_rows:
        _check_equal_split(items, len(weights), consumer.layout.dp, keep_groups, node)
        item_dp = None
        if placement is not None:
            placement.assign(keys, weights)
            item_dp = placement.equal_counts(keys)
        if item_dp is None:
            item_dp = balance.equal_count_assignment(weights, homes, consumer.layout.dp, tolerance)
    elif placement is not None:
        item_dp = placement.assign(keys, weights)
    else:
        item_dp = balance.balanced_assignment(weights, homes, consumer.layout.dp, tolerance)
    return RedistributionPlan(
        node, producer, consumer, fields, schema, table, item_dp[items], False, keep_groups
    )


def _check_table(table: SampleTable, producer: PlacedLayout, fields: FieldPlacement, node: str):
    for rank in np.unique(table.holders).tolist():
        if rank not in producer.holder_dp:
            sid = int(table.sample_ids[table.holders == rank][0])
            raise DataPlanError(
                node,
                f"rank {rank} holds samples (sample {sid} among them) but is not a holder of "
                f"the producer layout {producer.describe()}; only tp 0 / cp 0 / last-stage "
                f"ranks hold data: {list(producer.holders)}",
                key=sid,
                rank=rank,
            )
    ids, counts = np.unique(table.sample_ids, return_counts=True)
    if (counts > 1).any():
        sid = int(ids[counts > 1][0])
        ranks = sorted(set(table.holders[table.sample_ids == sid].tolist()))
        raise DataPlanError(
            node,
            f"sample {sid} appears {int(counts[counts > 1][0])} times, on ranks {ranks}; "
            "sample ids must be unique across ranks",
            key=sid,
            rank=ranks[-1],
        )
    if (table.lengths < 0).any():
        i = int(np.argmax(table.lengths < 0))
        raise DataPlanError(
            node,
            f"sample {int(table.sample_ids[i])} on rank {int(table.holders[i])} has length "
            f"{int(table.lengths[i])}",
            key=int(table.sample_ids[i]),
            rank=int(table.holders[i]),
        )
    # Ranks without samples may hand in an empty batch whose dtypes were never set; only holders of
    # samples vouch for the schema.
    holding = set(np.unique(table.holders).tolist())
    missing = holding - set(table.schemas)
    if missing:
        raise DataPlanError(node, f"rank {min(missing)} holds samples but gave no fields", rank=min(missing))
    schema, first_rank = None, None
    for rank, ranks_schema in sorted(table.schemas.items()):
        if rank not in holding:
            continue
        for name in fields.names:
            if name not in ranks_schema:
                raise DataPlanError(
                    node,
                    f"rank {rank} has no field {name!r}, which the consumer needs (it has "
                    f"{sorted(ranks_schema)})",
                    key=name,
                    rank=rank,
                )
        for name in ranks_schema:
            if name not in fields.stages:
                raise DataPlanError(
                    node,
                    f"field {name!r} from rank {rank} has no stage rule; add it to the "
                    f"FieldPlacement as 'first', 'last' or 'all' (rules: {list(fields.names)})",
                    key=name,
                    rank=rank,
                )
        if schema is None:
            schema, first_rank = ranks_schema, rank
            continue
        for name, s in ranks_schema.items():
            if s != schema[name]:
                raise DataPlanError(
                    node,
                    f"field {name!r} is {s.describe()} on rank {rank} but "
                    f"{schema[name].describe()} on rank {first_rank}",
                    key=name,
                    rank=rank,
                )
    if schema is None:  # no samples anywhere: any schema given will do for the empty batches
        schema = next(
            ({n: s for n, s in sch.items() if n in fields.stages} for sch in table.schemas.values()), {}
        )
    for name, rows in table.rows.items():
        if (rows < 0).any():
            i = int(np.argmax(rows < 0))
            raise DataPlanError(
                node,
                f"sample {int(table.sample_ids[i])} on rank {int(table.holders[i])} has no "
                f"rows for field {name!r}",
                key=name,
                rank=int(table.holders[i]),
            )
    return {n: schema[n] for n in fields.names if n in schema}


def _unequal_rows(table: Optional[SampleTable], consumer: PlacedLayout) -> bool:
    """Whether the samples, left where they are, give the consumer's DP ranks different row counts (e.g.
    DAPO's filter kept more groups on one engine than another): then even the identity layout moves."""
    if table is None or not len(table):
        return False
    dp_of_holder = np.array([consumer.dp_of(int(r)) for r in table.holders], dtype=np.int64)
    return len(set(np.bincount(dp_of_holder, minlength=consumer.layout.dp).tolist())) > 1


def _check_equal_split(items: np.ndarray, num_items: int, dp: int, keep_groups: bool, node: str) -> None:
    sizes = np.bincount(items, minlength=num_items)
    unit = "groups" if keep_groups else "samples"
    if len(set(sizes.tolist())) > 1:
        raise DataPlanError(
            node,
            f"groups have different sizes {sorted(set(sizes.tolist()))}; equal rows per "
            "data-parallel rank (a training layout) need equal groups",
        )
    if num_items % dp:
        raise DataPlanError(
            node,
            f"{num_items} {unit} do not split equally over the consumer's {dp} data-parallel "
            f"ranks (a training layout needs equal rows per rank): make the batch's {unit} a "
            f"multiple of {dp}",
        )


def _items(table: SampleTable, consumer: PlacedLayout, keep_groups: bool, node: str):
    """Balancing units: samples, or whole groups. Returns (item index per sample, item keys (sample or group
    ids), item weights, item homes)."""
    home_of_rank = {
        r: (consumer.dp_of(r) if consumer.dp_of(r) is not None else -1)
        for r in np.unique(table.holders).tolist()
    }
    sample_home = np.array([home_of_rank[r] for r in table.holders.tolist()], dtype=np.int64)
    if not keep_groups:
        return np.arange(len(table)), table.sample_ids, table.lengths, sample_home
    groups, first, items = np.unique(table.groups, return_index=True, return_inverse=True)
    first_holder = table.holders[first]  # the holder of each group's lowest sample id
    split = np.flatnonzero(first_holder[items] != table.holders)
    if split.size:
        i = int(split[0])
        g = int(table.groups[i])
        ranks = sorted(set(table.holders[table.groups == g].tolist()))
        raise DataPlanError(
            node,
            f"group {g} is split over ranks {ranks} (sample {int(table.sample_ids[i])} on rank "
            f"{int(table.holders[i])}); with keep_groups a prompt's group must be produced whole "
            "on one rank - are group ids unique across ranks?",
            key=g,
            rank=int(table.holders[i]),
        )
    weights = np.bincount(items, weights=table.lengths, minlength=len(groups)).astype(np.int64)
    homes = np.array([home_of_rank[r] for r in first_holder.tolist()], dtype=np.int64)
    return items, groups, weights, homes
